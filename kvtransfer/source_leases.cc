#include "kvtransfer/source_leases.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/kv_handle.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

SourceLeases::SourceLeases(KvLeaseTable* table, std::string worker_id, uint64_t epoch,
                           absl::Duration max_lease)
    : table_(table), worker_id_(std::move(worker_id)), epoch_(epoch), max_lease_(max_lease) {}

bool SourceLeases::AcceptsHandshakeFrom(const std::string& reader) const {
  return table_->HasLeaseFor(reader);
}

absl::StatusOr<bool> SourceLeases::Release(const std::string& worker_id, uint64_t epoch,
                                           uint64_t lease_id, const std::string& reader) {
  if (!IsThisIncarnation(worker_id, epoch)) return false;  // another incarnation's: gone
  const absl::Status allowed = table_->AuthorizeLeaseUse({lease_id, reader, nullptr});
  if (absl::IsNotFound(allowed)) return false;
  if (!allowed.ok()) return allowed;
  return table_->ReleaseLease(lease_id);
}

absl::StatusOr<std::optional<absl::Time>> SourceLeases::Renew(const std::string& worker_id,
                                                              uint64_t epoch, uint64_t lease_id,
                                                              const std::string& reader,
                                                              absl::Duration extend) {
  if (!IsThisIncarnation(worker_id, epoch)) return std::optional<absl::Time>();
  const absl::Status allowed = table_->AuthorizeLeaseUse({lease_id, reader, nullptr});
  if (absl::IsNotFound(allowed)) return std::optional<absl::Time>();
  if (!allowed.ok()) return allowed;
  // Whole milliseconds, as the RPC carries them.
  const int64_t extend_ms =
      std::min<int64_t>(absl::ToInt64Milliseconds(extend), absl::ToInt64Milliseconds(max_lease_));
  return table_->RenewLease(lease_id, absl::Milliseconds(extend_ms));
}

absl::Status SourceLeases::CheckHandle(const tandem::v1::KvHandle& handle) const {
  if (handle.worker_id() != worker_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV handle names source ", handle.worker_id(), ", this is ", worker_id_));
  }
  if (handle.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat("stale KV handle: source ", worker_id_,
                                                      " restarted (epoch ", epoch_,
                                                      ", handle epoch ", handle.epoch(), ")"));
  }
  if (handle.block_ids_size() > tandem::v1::kMaxKvHandleBlocks) {
    return absl::InvalidArgumentError("KV handle has too many blocks");
  }
  return absl::OkStatus();
}

absl::Status SourceLeases::AuthorizeRead(const tandem::v1::KvHandle& handle,
                                         const std::string& reader) const {
  if (absl::Status ours = CheckHandle(handle); !ours.ok()) return ours;
  const LeaseBinding presented = PresentedBinding(handle);
  return table_->AuthorizeLeaseUse({handle.lease_id(), reader, &presented});
}

}  // namespace tandem::kvtransfer
