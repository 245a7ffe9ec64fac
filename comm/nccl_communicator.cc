#include "comm/nccl_communicator.h"

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/nccl_status.h"
#include "common/status_macros.h"

namespace tandem::comm {
namespace {

ncclDataType_t NcclType(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32:
      return ncclFloat32;
    case CommDtype::kBf16:
      return ncclBfloat16;
    case CommDtype::kF16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

// Polls `done` (yielding between polls) until it answers true or an error, or `deadline`.
template <typename Done>
absl::Status PollUntil(Done done, absl::Time deadline, const char* what, absl::Duration timeout) {
  for (uint32_t spins = 0;; ++spins) {
    ASSIGN_OR_RETURN(bool finished, done());
    if (finished) return absl::OkStatus();
    if ((spins & 255) == 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("nccl: ", what, " did not finish within ",
                                                      absl::FormatDuration(timeout),
                                                      " (a rank of the group is dead or wedged)"));
    }
    std::this_thread::yield();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    ProcessGroup* bootstrap, const NcclCommunicatorOptions& options) {
  if (bootstrap == nullptr) return absl::InvalidArgumentError("nccl: no bootstrap group");
  RETURN_IF_ERROR(bootstrap->status());
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(bootstrap->rank(), bootstrap->size(), options));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (c->rank_ == 0) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  RETURN_IF_ERROR(bootstrap->Broadcast(absl::MakeSpan(reinterpret_cast<char*>(&id), sizeof(id)),
                                       /*root=*/0));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = ncclCommInitRankConfig(&c->comm_, c->size_, id, c->rank_, &config);
  if (init != ncclSuccess && init != ncclInProgress) NCCL_RETURN_IF_ERROR(init);
  const absl::Time deadline = absl::Now() + options.timeout;
  RETURN_IF_ERROR(c->Fail(PollUntil(
      [&]() -> absl::StatusOr<bool> {
        ncclResult_t state = ncclSuccess;
        NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(c->comm_, &state));
        if (state == ncclInProgress) return false;
        NCCL_RETURN_IF_ERROR(state);
        return true;
      },
      deadline, "communicator init", options.timeout)));
  if (options.custom_all_reduce_max_bytes <= 0 || c->size_ == 1) {
    c->custom_off_ = "not asked for";
    return c;
  }
  CustomAllReduceOptions custom;
  custom.device = options.device;
  custom.limits.max_bytes = options.custom_all_reduce_max_bytes;
  custom.programmatic_launch = options.custom_all_reduce_pdl;
  custom.timeout = options.timeout;
  ASSIGN_OR_RETURN(c->custom_, CustomAllReduce::Create(bootstrap, custom, &c->custom_off_));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(options_.device);
  // Abort, not destroy: local, and it makes kernels still waiting for a peer exit.
  if (comm_ != nullptr && !aborted_) ncclCommAbort(comm_);
  if (done_ != nullptr) cudaEventDestroy(done_);
}

absl::Status NcclCommunicator::status() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::Status NcclCommunicator::Fail(absl::Status error) {
  if (error.ok()) return error;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    failure_ = error;
  }
  if (comm_ != nullptr && !aborted_) {
    ncclCommAbort(comm_);
    aborted_ = true;
  }
  return error;
}

absl::Status NcclCommunicator::CheckUsable(int64_t count) const {
  if (count < 0) return absl::InvalidArgumentError("nccl: negative element count");
  return status();
}

absl::Status NcclCommunicator::Settle(const char* what, ncclResult_t result) {
  if (result != ncclSuccess && result != ncclInProgress) {
    return Fail(NcclStatus(result, {what, __FILE__, __LINE__}));
  }
  if (result == ncclSuccess) return absl::OkStatus();
  return Fail(PollUntil(
      [&]() -> absl::StatusOr<bool> {
        ncclResult_t state = ncclSuccess;
        NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
        if (state == ncclInProgress) return false;
        NCCL_RETURN_IF_ERROR(state);
        return true;
      },
      absl::Now() + options_.timeout, what, options_.timeout));
}

absl::Status NcclCommunicator::AllReduceSum(void* data, int64_t count, CommDtype dtype,
                                            DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(count));
  if (count == 0) return absl::OkStatus();
  // Every rank decides alike (same count, dtype and group); alignment is the caller's layout,
  // the same on every rank of a model.
  if (custom_ != nullptr && reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
      custom_->Plan(count * CommDtypeBytes(dtype)).path != ArPath::kNccl) {
    return Fail(custom_->AllReduce(data, data, count, dtype, stream));
  }
  return Settle("all-reduce",
                ncclAllReduce(data, data, count, NcclType(dtype), ncclSum, comm_, stream));
}

absl::StatusOr<bool> NcclCommunicator::AllReduceAddRmsNorm(const AddRmsNormArgs& args,
                                                           CommDtype dtype, DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(args.rows * args.hidden));
  if (custom_ == nullptr || !options_.fuse_all_reduce_norm || args.rows == 0) return false;
  absl::StatusOr<bool> done = custom_->AllReduceAddRmsNorm(args, dtype, stream);
  if (!done.ok()) return Fail(done.status());
  return *done;
}

absl::Status NcclCommunicator::AllGather(const void* in, void* out, int64_t count, CommDtype dtype,
                                         DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(count));
  if (count == 0) return absl::OkStatus();
  return Settle("all-gather", ncclAllGather(in, out, count, NcclType(dtype), comm_, stream));
}

absl::Status NcclCommunicator::ReduceScatterSum(const void* in, void* out, int64_t count,
                                                CommDtype dtype, DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(count));
  if (count == 0) return absl::OkStatus();
  return Settle("reduce-scatter",
                ncclReduceScatter(in, out, count, NcclType(dtype), ncclSum, comm_, stream));
}

absl::Status NcclCommunicator::AllToAll(const void* in, absl::Span<const int64_t> send_counts,
                                        void* out, absl::Span<const int64_t> recv_counts,
                                        CommDtype dtype, DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(0));
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: counts for ", send_counts.size(),
                                                   " / ", recv_counts.size(), " ranks, group of ",
                                                   size_));
  }
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] < 0 || recv_counts[r] < 0) {
      return absl::InvalidArgumentError("all-to-all: negative count");
    }
  }
  if (send_counts[rank_] != recv_counts[rank_]) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: rank ", rank_, " sends itself ",
                                                   send_counts[rank_], " but receives ",
                                                   recv_counts[rank_]));
  }
  const int64_t elem = CommDtypeBytes(dtype);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  int64_t send_at = 0, recv_at = 0;
  // The rank's own part is a device copy; the others one NCCL group of sends and receives.
  ncclResult_t r = ncclGroupStart();
  for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
    if (peer == rank_) {
      if (send_counts[peer] > 0) {
        const cudaError_t copy =
            cudaMemcpyAsync(dst + recv_at * elem, src + send_at * elem, send_counts[peer] * elem,
                            cudaMemcpyDeviceToDevice, stream);
        if (copy != cudaSuccess) {
          ncclGroupEnd();
          CUDA_RETURN_IF_ERROR(copy);
        }
      }
    } else {
      if (send_counts[peer] > 0) {
        r = ncclSend(src + send_at * elem, send_counts[peer], NcclType(dtype), peer, comm_, stream);
      }
      if ((r == ncclSuccess || r == ncclInProgress) && recv_counts[peer] > 0) {
        r = ncclRecv(dst + recv_at * elem, recv_counts[peer], NcclType(dtype), peer, comm_, stream);
      }
      if (r == ncclInProgress) r = ncclSuccess;
    }
    send_at += send_counts[peer];
    recv_at += recv_counts[peer];
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess) return Settle("all-to-all", r);
  return Settle("all-to-all", end);
}

absl::Status NcclCommunicator::Send(const void* data, int64_t count, CommDtype dtype, int peer,
                                    DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(count));
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("send: peer ", peer, " of ", size_));
  }
  return Settle("send", ncclSend(data, count, NcclType(dtype), peer, comm_, stream));
}

absl::Status NcclCommunicator::Recv(void* data, int64_t count, CommDtype dtype, int peer,
                                    DeviceStream stream) {
  RETURN_IF_ERROR(CheckUsable(count));
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("recv: peer ", peer, " of ", size_));
  }
  return Settle("recv", ncclRecv(data, count, NcclType(dtype), peer, comm_, stream));
}

absl::Status NcclCommunicator::Synchronize(DeviceStream stream) {
  RETURN_IF_ERROR(status());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream));
  RETURN_IF_ERROR(Fail(PollUntil(
      [&]() -> absl::StatusOr<bool> {
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return true;
        if (q != cudaErrorNotReady) CUDA_RETURN_IF_ERROR(q);
        ncclResult_t state = ncclSuccess;
        NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
        if (state != ncclInProgress) NCCL_RETURN_IF_ERROR(state);
        return false;
      },
      absl::Now() + options_.timeout, "a step's collectives", options_.timeout)));
  if (custom_ != nullptr && custom_->Aborted()) {
    return Fail(absl::DeadlineExceededError(
        absl::StrCat("custom all-reduce: a peer did not arrive within ",
                     absl::FormatDuration(options_.timeout), " (a rank is dead or wedged)")));
  }
  return absl::OkStatus();
}

}  // namespace tandem::comm
