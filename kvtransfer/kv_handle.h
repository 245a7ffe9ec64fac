// The KV handle (proto tandem.v1.KvHandle) and its in-process forms, converted in one place:
//
//   source side (P):  KvSource + KvLease + held block ids  --ToKvHandle-->  KvHandle (to the
//   router) reader side (D):  KvHandle (from the router)  --ValidateKvHandle, ToRemoteKvSpec-->
//                     RemoteKvSpec (to the engine's connector)
//
// Thread safety: pure functions.
#ifndef TANDEM_KVTRANSFER_KV_HANDLE_H_
#define TANDEM_KVTRANSFER_KV_HANDLE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/connector.h"
#include "kvtransfer/lease_table.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

// Who serves the blocks a handle names: fixed for one worker incarnation.
struct KvSource {
  std::string worker_id;
  uint64_t epoch = 0;        // the worker's start time (Unix us): a restart makes handles stale
  uint64_t layout_hash = 0;  // CompatibilityHash of its KV layout
  std::string transfer_endpoint;  // host:port of its KvTransferService
};

// P: the handle for `block_ids` (logical order) holding `num_tokens` tokens of request
// `request_id` under `lease`.
tandem::v1::KvHandle ToKvHandle(const KvSource& source, const KvLease& lease,
                                absl::Span<const int32_t> block_ids, int64_t num_tokens,
                                const std::string& request_id);

// What a handle claims about its lease (request, blocks, tokens), for the source to compare
// with what it issued (KvLeaseTable::AuthorizeLeaseUse). `reader` is left empty.
LeaseBinding PresentedBinding(const tandem::v1::KvHandle& handle);

// D: INVALID_ARGUMENT for a handle this worker cannot use: a layout hash other than
// `local_layout_hash`, a missing or oversized worker id, an oversized request id, or more than
// kMaxKvHandleBlocks blocks.
// (Whether the blocks cover the prompt is the engine's check: Engine::ValidateRequest.)
absl::Status ValidateKvHandle(const tandem::v1::KvHandle& handle, uint64_t local_layout_hash);

// D: what a reader needs of the sources named by handles: a link to the source (handshake
// once per source incarnation; FAILED_PRECONDITION for a restarted source or an incompatible
// one, UNAVAILABLE when it does not answer) and the LeaseClient that renews and releases its
// leases. PeerLinks (kv_transfer_service.h) implements it over the KvTransferService RPCs.
// Thread-safe.
class KvSourceLinks {
 public:
  virtual ~KvSourceLinks() = default;
  virtual absl::Status EnsurePeer(const tandem::v1::KvHandle& handle) = 0;
  // Asks the handle's source whether this worker may read what the handle names (before
  // EnsurePeer: the source describes its pool only to a reader it holds a lease for): OK,
  // PERMISSION_DENIED (not issued for this worker, or not as presented), NOT_FOUND (the lease is
  // gone), FAILED_PRECONDITION (a stale handle: the source restarted), UNAVAILABLE (no answer).
  virtual absl::Status AuthorizeRead(const tandem::v1::KvHandle& handle) = 0;
  virtual std::shared_ptr<LeaseClient> lease_client() const = 0;
};

// D: the engine's view of a validated handle. The load gives up at `load_deadline`; `leases`
// renews and releases the source's lease (may be null).
RemoteKvSpec ToRemoteKvSpec(const tandem::v1::KvHandle& handle, absl::Time load_deadline,
                            std::shared_ptr<LeaseClient> leases);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_HANDLE_H_
