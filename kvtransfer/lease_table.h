// KvLeaseTable: the source side's (P's) table of KV leases, as the worker core and the RPC
// threads see it (the engine sees only KvConnector, connector.h; vLLM v1 splits its connector by
// role the same way). A lease keeps a finished request's blocks for one remote reader; the engine
// grants it (KvConnector::RequestFinished) and frees the blocks once GetFinished reports it ended.
//
//  * worker core (a prefill's RPC thread): PrepareForRemoteRead, BindLease before the handle is
//    published; ReleaseLease when it cannot be; ReassignLease / ReleaseLeaseOf for the router's
//    replacement of a decode worker and for aborts.
//  * control plane (KvTransferService's RPC threads, through SourceLeases in source_leases.h):
//    HasLeaseFor, AuthorizeLeaseUse, RenewLease, ReleaseLease.
//
// Thread safety: implementations are thread-safe.
#ifndef TANDEM_KVTRANSFER_LEASE_TABLE_H_
#define TANDEM_KVTRANSFER_LEASE_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem::kvtransfer {

// What a source lease was issued for (P side; BindLease records it before the handle is
// published, so a lease is never known outside P without it). A handle presented to the source
// is honoured only when it names exactly this (source_leases.h, AuthorizeRead), and only
// `reader` may use the lease at all.
struct LeaseBinding {
  // The worker id of the one reader allowed to use the lease (the decode worker the router
  // picked). Empty: any reader (an --insecure worker asked without one; see the README).
  std::string reader;
  std::string request_id;          // the router's request id (KvHandle.request_id)
  std::vector<int32_t> block_ids;  // as issued, logical order
  int64_t num_tokens = 0;
};

// One use of a source lease over the control plane, as the source's service saw it.
struct LeaseUse {
  uint64_t lease_id = 0;
  // The caller's worker id: from its certificate with mTLS, as claimed with --insecure.
  std::string reader;
  // A read: the handle the caller presents (request id, blocks, tokens). Null for a renewal or a
  // release, where the lease id and the caller suffice.
  const LeaseBinding* presented = nullptr;
};

class KvLeaseTable {
 public:
  virtual ~KvLeaseTable() = default;

  // ---- Worker core ----
  // Makes held blocks readable by remote peers (the agent's SyncForRemoteRead over their byte
  // ranges: a device -> host mirror where the agent stages GPU memory; else nothing). Call after
  // their KV is final, before their handle is published.
  virtual absl::Status PrepareForRemoteRead(absl::Span<const int32_t> block_ids) = 0;
  // Records what `lease_id` (just granted, not yet published) was issued for. NOT_FOUND for an
  // unknown lease, FAILED_PRECONDITION when it is bound already, INVALID_ARGUMENT when the
  // binding's blocks are not the lease's count.
  virtual absl::Status BindLease(uint64_t lease_id, LeaseBinding binding) = 0;
  // Moves the lease of request `request_id` to another reader (the router replaced a failed
  // decode worker). NOT_FOUND unless `lease_id` is that request's bound lease.
  virtual absl::Status ReassignLease(const std::string& request_id, uint64_t lease_id,
                                     const std::string& reader) = 0;
  // The reader is done with the lease: its blocks are reported in sending_done. False for an
  // unknown (expired, released) lease.
  virtual bool ReleaseLease(uint64_t lease_id) = 0;
  // The lease held for request `external_id` (RequestFinished), e.g. when the request is
  // aborted after its prefill: released like ReleaseLease. False when none is held.
  virtual bool ReleaseLeaseOf(const std::string& external_id) = 0;

  // ---- Control plane ----
  // Extends a live lease to now + extend; nullopt for an unknown lease.
  virtual std::optional<absl::Time> RenewLease(uint64_t lease_id, absl::Duration extend) = 0;
  // OK when `use` may go ahead: the lease is live and bound, `use.reader` is its reader (or it
  // has none), and a presented handle is exactly what was issued. NOT_FOUND for an unknown
  // lease; PERMISSION_DENIED otherwise (an unbound lease included).
  virtual absl::Status AuthorizeLeaseUse(const LeaseUse& use) const = 0;
  // Whether a live lease is bound to `reader` (the source answers a handshake only then).
  virtual bool HasLeaseFor(const std::string& reader) const = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_LEASE_TABLE_H_
