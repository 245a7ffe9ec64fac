#include "kvtransfer/kv_handle.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

tandem::v1::KvHandle ToKvHandle(const KvSource& source, const KvLease& lease,
                                absl::Span<const int32_t> block_ids, int64_t num_tokens,
                                const std::string& request_id) {
  tandem::v1::KvHandle handle;
  handle.set_worker_id(source.worker_id);
  handle.set_epoch(source.epoch);
  for (int32_t b : block_ids) handle.add_block_ids(static_cast<uint32_t>(b));
  handle.set_num_tokens(static_cast<uint64_t>(num_tokens));
  handle.set_layout_hash(source.layout_hash);
  handle.set_lease_id(lease.lease_id);
  handle.set_lease_deadline_unix_ms(absl::ToUnixMillis(lease.deadline));
  handle.set_transfer_endpoint(source.transfer_endpoint);
  handle.set_request_id(request_id);
  return handle;
}

LeaseBinding PresentedBinding(const tandem::v1::KvHandle& handle) {
  LeaseBinding presented;
  presented.request_id = handle.request_id();
  presented.block_ids.reserve(handle.block_ids_size());
  // An id above INT32_MAX wraps negative and so matches no issued block.
  for (uint32_t b : handle.block_ids()) presented.block_ids.push_back(static_cast<int32_t>(b));
  presented.num_tokens = static_cast<int64_t>(
      std::min<uint64_t>(handle.num_tokens(), std::numeric_limits<int64_t>::max()));
  return presented;
}

absl::Status ValidateKvHandle(const tandem::v1::KvHandle& handle, uint64_t local_layout_hash) {
  if (handle.layout_hash() != local_layout_hash) {
    return absl::InvalidArgumentError(absl::StrCat("KV handle layout ", handle.layout_hash(),
                                                   " does not match this worker's ",
                                                   local_layout_hash));
  }
  if (handle.block_ids_size() > tandem::v1::kMaxKvHandleBlocks || handle.worker_id().empty() ||
      handle.worker_id().size() > static_cast<size_t>(tandem::v1::kMaxIdBytes) ||
      handle.request_id().size() > static_cast<size_t>(tandem::v1::kMaxIdBytes)) {
    return absl::InvalidArgumentError("malformed KV handle");
  }
  return absl::OkStatus();
}

RemoteKvSpec ToRemoteKvSpec(const tandem::v1::KvHandle& handle, absl::Time load_deadline,
                            std::shared_ptr<LeaseClient> leases) {
  RemoteKvSpec remote;
  remote.peer = handle.worker_id();
  remote.epoch = handle.epoch();
  remote.block_ids.assign(handle.block_ids().begin(), handle.block_ids().end());
  remote.num_tokens = static_cast<int64_t>(handle.num_tokens());
  remote.lease_id = handle.lease_id();
  remote.deadline = load_deadline;
  remote.lease_deadline = absl::FromUnixMillis(handle.lease_deadline_unix_ms());
  remote.lease_client = std::move(leases);
  return remote;
}

}  // namespace tandem::kvtransfer
