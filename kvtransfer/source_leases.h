// SourceLeases: a KV source's answers to its readers' lease requests (the KvTransferService
// RPCs: Handshake, ReleaseLease, RenewLease, AuthorizeRead), decided over its KvLeaseTable
// (lease_table.h) so that the gRPC service (kv_transfer_service.h) only translates: it names the
// caller (from its certificate, or as claimed on a plain-text plane) and turns these results into
// replies. No gRPC type here.
//
// A request names the source incarnation it means (worker id + epoch); one for another
// incarnation finds no lease here (the leases died with it). Refusals are PERMISSION_DENIED with
// the reason (the service hides it from the caller); an unknown lease is NOT_FOUND.
//
// Thread safety: thread-safe (the table is).
#ifndef TANDEM_KVTRANSFER_SOURCE_LEASES_H_
#define TANDEM_KVTRANSFER_SOURCE_LEASES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/lease_table.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

class SourceLeases {
 public:
  // `table` must outlive this object. A renewal extends a lease by at most `max_lease` (the
  // source bounds how long its blocks can be held, not the reader).
  SourceLeases(KvLeaseTable* table, std::string worker_id, uint64_t epoch,
               absl::Duration max_lease);

  // Whether a request naming (worker_id, epoch) is for this incarnation.
  bool IsThisIncarnation(const std::string& worker_id, uint64_t epoch) const {
    return worker_id == worker_id_ && epoch == epoch_;
  }
  // Handshake: only a reader some live lease is bound to learns how to reach the pool.
  bool AcceptsHandshakeFrom(const std::string& reader) const;
  // ReleaseLease from `reader`: true when released, false for a lease this incarnation does not
  // hold (expired, released, or another incarnation's); PERMISSION_DENIED when `reader` may not.
  absl::StatusOr<bool> Release(const std::string& worker_id, uint64_t epoch, uint64_t lease_id,
                               const std::string& reader);
  // RenewLease from `reader` by `extend` (at most max_lease): the new deadline, nullopt where
  // Release would answer false; PERMISSION_DENIED as for Release.
  absl::StatusOr<std::optional<absl::Time>> Renew(const std::string& worker_id, uint64_t epoch,
                                                  uint64_t lease_id, const std::string& reader,
                                                  absl::Duration extend);
  // The handle is this incarnation's and well-formed: FAILED_PRECONDITION for another source or
  // a stale epoch (the source restarted), INVALID_ARGUMENT for too many blocks.
  absl::Status CheckHandle(const tandem::v1::KvHandle& handle) const;
  // AuthorizeRead: CheckHandle, then OK only when `reader` is the lease's reader and the handle
  // is exactly what was issued (request id, blocks, tokens); NOT_FOUND for an unknown lease.
  absl::Status AuthorizeRead(const tandem::v1::KvHandle& handle, const std::string& reader) const;

 private:
  KvLeaseTable* const table_;
  const std::string worker_id_;
  const uint64_t epoch_;
  const absl::Duration max_lease_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_SOURCE_LEASES_H_
