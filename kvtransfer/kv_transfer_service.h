// The P/D control plane around a TransferAgent (proto KvTransferService):
//
//  * KvTransferServiceImpl, served by every KV source (prefill / mixed worker): answers a
//    reader's Handshake (compatibility check, then both sides know each other's transport
//    descriptor), ReleaseLease / RenewLease on the source's lease table, and AuthorizeRead. It
//    only translates: who the caller is (below) and the replies; what to answer is decided by
//    SourceLeases (source_leases.h) over the KvLeaseTable.
//
// Lease binding (kvtransfer/README.md, "Lease binding"): a lease is bound to the decode worker
// the router picked (KvLeaseTable::BindLease). Every RPC names its caller: on an mTLS plane the
// worker id of the caller's certificate (spiffe://tandem/role/<role>/worker/<id>), on a
// plain-text plane (--insecure) the id the request claims. Handshake accepts only a caller some
// live lease is bound to (and hands it the transport's short-lived access token; others get
// accepted = false with nothing but the source's worker id and epoch); Renew / Release
// act only for the lease's reader; AuthorizeRead is OK only when the presented handle is exactly
// what was issued (request id, blocks, tokens, lease) and the caller is its reader. Refusals are
// PERMISSION_DENIED; an unknown lease is NOT_FOUND (AuthorizeRead) or renewed / released = false.
//  * PeerLinks, used by every reader (decode / mixed worker): handshakes once per source
//    incarnation (worker id + epoch) before the first READ, detects a restarted source (its
//    epoch differs from the handle's: the handle is stale), and gives the connector a
//    LeaseClient (lease_client(), for RemoteKvSpec) that renews leases for long loads and
//    releases them when loads end, asynchronously.
//
// Thread safety: both classes are thread-safe.
#ifndef TANDEM_KVTRANSFER_KV_TRANSFER_SERVICE_H_
#define TANDEM_KVTRANSFER_KV_TRANSFER_SERVICE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_strict_parse.h"
#include "common/security/security_config.h"
#include "kvtransfer/connector.h"
#include "kvtransfer/kv_handle.h"
#include "kvtransfer/lease_table.h"
#include "kvtransfer/source_leases.h"
#include "kvtransfer/transfer_agent.h"
#include "tandem/v1/kv.grpc.pb.h"

namespace tandem::kvtransfer {

class KvTransferServiceImpl final : public tandem::v1::KvTransferService::Service {
 public:
  // `local`: this worker's handshake (worker id, epoch, compatibility; transport fields are
  // filled from `agent`). `agent` and `leases` must outlive the service.
  // A renewal extends a lease by at most `max_lease` (the worker bounds how long its blocks can
  // be held, not the reader).
  KvTransferServiceImpl(TransferAgent* agent, KvLeaseTable* leases,
                        tandem::v1::TransferHandshake local,
                        absl::Duration max_lease = absl::Minutes(2));

  grpc::Status Handshake(grpc::ServerContext* context, const tandem::v1::TransferHandshake* request,
                         tandem::v1::TransferHandshakeResponse* response) override;
  grpc::Status ReleaseLease(grpc::ServerContext* context,
                            const tandem::v1::ReleaseLeaseRequest* request,
                            tandem::v1::ReleaseLeaseResponse* response) override;
  grpc::Status RenewLease(grpc::ServerContext* context,
                          const tandem::v1::RenewLeaseRequest* request,
                          tandem::v1::RenewLeaseResponse* response) override;
  grpc::Status AuthorizeRead(grpc::ServerContext* context,
                             const tandem::v1::AuthorizeReadRequest* request,
                             tandem::v1::AuthorizeReadResponse* response) override;

 private:
  TransferAgent* const agent_;
  tandem::v1::TransferHandshake local_;  // immutable after construction
  SourceLeases leases_;                  // after local_: built from its worker id and epoch
};

// `service`'s methods behind strict request parsing (common/grpc_strict_parse.h): request bytes
// that do not parse are INVALID_ARGUMENT. Register the result instead of `service` (which must
// outlive it); an error when the list misses a KvTransferService method.
absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictKvTransferService(
    tandem::v1::KvTransferService::Service* service);

class PeerLinks final : public KvSourceLinks {
 public:
  // Connects the reading side to a source that passed the handshake checks (every rank of a
  // worker group links to the source's ranks: RankKvReader::AddSource, GroupBlockTransport).
  using SourceLinker =
      std::function<absl::Status(const std::string& peer, const tandem::v1::TransferHandshake&)>;
  // `local`: this worker's handshake, as for the service. `agent` must outlive this object.
  // `linker` null: agent->AddPeer (whole blocks from a source split like this worker).
  // `linked` (may be null): whether the reading side still holds a working link to a peer
  // (RankKvReader::SourceLinked); false makes the next EnsurePeer handshake and link again even
  // for the same source incarnation (its connection was closed after it stopped answering).
  using LinkCheck = std::function<bool(const std::string& peer)>;
  // `security`: this worker's TLS identity for the channels to sources (insecure: plain text).
  PeerLinks(TransferAgent* agent, tandem::v1::TransferHandshake local,
            security::SecurityConfig security, absl::Duration rpc_timeout = absl::Seconds(5),
            SourceLinker linker = nullptr, LinkCheck linked = nullptr);
  ~PeerLinks();  // sends the queued lease releases (each bounded by rpc_timeout), then stops

  // Ensures the agent can read the blocks of `handle`: handshakes with handle.transfer_endpoint
  // unless the same source incarnation is already connected. FAILED_PRECONDITION when the
  // source's epoch is not the handle's (the source restarted: its blocks are gone) or the
  // layouts are incompatible; UNAVAILABLE when the source does not answer; PERMISSION_DENIED
  // when the source refuses us (no lease bound to us) or, with mTLS, the endpoint's certificate
  // is not the handle's worker.
  absl::Status EnsurePeer(const tandem::v1::KvHandle& handle) override;
  // The AuthorizeRead RPC (synchronous, bounded by rpc_timeout).
  absl::Status AuthorizeRead(const tandem::v1::KvHandle& handle) override;
  // Tells the source that the handle's lease is done (best effort, in the background).
  void ReleaseLease(const tandem::v1::KvHandle& handle);
  // Renews leases of handshaked sources with RenewLease RPCs on the background thread (before
  // queued releases). After ~PeerLinks it answers CANCELLED, so it may outlive this object.
  std::shared_ptr<LeaseClient> lease_client() const override;

  uint64_t handshakes() const;

 private:
  class Renewer;
  struct PendingRenewal {
    std::shared_ptr<tandem::v1::KvTransferService::Stub> stub;
    tandem::v1::RenewLeaseRequest request;
    std::function<void(absl::StatusOr<absl::Time>)> done;
  };
  // Queues a ReleaseLease RPC to the handshaked source `peer` (dropped when it is unknown or its
  // epoch is not `epoch`).
  void QueueRelease(const std::string& peer, uint64_t epoch, uint64_t lease_id);
  // Queues a renewal; an error (nothing queued) when `peer` is not a handshaked source.
  absl::Status QueueRenewal(const std::string& peer, uint64_t epoch, uint64_t lease_id,
                            absl::Duration extend,
                            std::function<void(absl::StatusOr<absl::Time>)>& done);
  void SendRenewal(PendingRenewal renewal);
  struct Peer {
    uint64_t epoch = 0;
    std::string endpoint;
    std::shared_ptr<tandem::v1::KvTransferService::Stub> stub;
  };
  struct PendingRelease {
    std::shared_ptr<tandem::v1::KvTransferService::Stub> stub;
    tandem::v1::ReleaseLeaseRequest request;
    // A release whose RPC failed (the source unreachable or stopped for a while) is tried again
    // later, so the source frees the blocks when it answers again rather than at lease expiry.
    int attempts = 0;
    absl::Time not_before = absl::InfinitePast();
  };
  absl::StatusOr<std::shared_ptr<tandem::v1::KvTransferService::Stub>> StubFor(
      const tandem::v1::KvHandle& handle);
  // The background thread: sends queued RenewLease RPCs, then ReleaseLease RPCs, in order.
  void ReleaseLoop();

  TransferAgent* const agent_;
  tandem::v1::TransferHandshake local_;
  const security::SecurityConfig security_;
  const absl::Duration rpc_timeout_;
  const SourceLinker linker_;
  const LinkCheck linked_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  // Serializes handshakes so two requests from one new source handshake once.
  absl::Mutex handshake_mu_;
  uint64_t handshakes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<PendingRelease> releases_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingRenewal> renewals_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Renewer> renewer_;
  std::thread releaser_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_TRANSFER_SERVICE_H_
