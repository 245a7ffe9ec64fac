// NcclCommunicator: DeviceCommunicator (device_communicator.h) over NCCL, one GPU per rank.
//
// Bootstrap: rank 0 draws the ncclUniqueId and broadcasts it over the group's host ProcessGroup
// (Gloo, which met on --dist_init), so NCCL needs no rendezvous of its own and works across
// hosts. The communicator is created non-blocking (ncclConfig_t::blocking = 0) and its init is
// polled against the deadline; every call is polled until NCCL has launched it (ncclInProgress)
// within the deadline. Synchronize() polls the stream's progress and ncclCommGetAsyncError; on
// the deadline or an asynchronous error (a peer's network failure) the communicator is aborted
// (ncclCommAbort: NCCL kernels waiting for a dead or wedged peer exit) and the group is broken.
//
// Graphs: the calls may be captured (graph_capturable()); a captured collective is launched by
// cudaGraphLaunch and waited for by Synchronize() like any other.
//
// All-reduce: small messages inside one host take CustomAllReduce (one kernel over CUDA IPC,
// comm/README.md "All-reduce paths") when it could be set up at creation; NCCL otherwise. The
// same kernels offer the all-reduce fused with the residual add and RMSNorm after it.
//
// Thread safety: as DeviceCommunicator.
#ifndef TANDEM_COMM_NCCL_COMMUNICATOR_H_
#define TANDEM_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/custom_all_reduce.h"
#include "comm/device_communicator.h"
#include "comm/process_group.h"

namespace tandem::comm {

struct NcclCommunicatorOptions {
  int device = 0;
  // Deadline of the init and of every wait (Synchronize, a call's launch).
  absl::Duration timeout = absl::Seconds(30);
  // All-reduces of at most this many bytes take the custom one-shot / two-shot kernels
  // (custom_all_reduce.h) where the group allows them (one host, 2/4/8 GPUs with peer access);
  // 0: NCCL only.
  int64_t custom_all_reduce_max_bytes = int64_t{8} << 20;
  // Offer the custom all-reduce's fused all-reduce + add + RMSNorm (AllReduceAddRmsNorm); false:
  // callers run the all-reduce and their own norm (comparisons).
  bool fuse_all_reduce_norm = true;
  // The custom kernels launch with programmatic dependent launch (CustomAllReduceOptions).
  bool custom_all_reduce_pdl = true;
};

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // Collective over `bootstrap` (every rank calls it with its own device): UNAVAILABLE /
  // DEADLINE_EXCEEDED when a rank does not join in time, NCCL's errors otherwise.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      ProcessGroup* bootstrap, const NcclCommunicatorOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status status() const override;
  // "nccl", or "nccl+custom-ar" with the custom all-reduce.
  std::string_view backend() const override {
    return custom_ != nullptr ? "nccl+custom-ar" : "nccl";
  }
  // Why the custom all-reduce is off ("" when on).
  const std::string& custom_all_reduce_off_reason() const { return custom_off_; }
  bool graph_capturable() const override { return true; }

  absl::Status AllReduceSum(void* data, int64_t count, CommDtype dtype,
                            DeviceStream stream) override;
  // The custom all-reduce's fused kernel where it takes the shape (and fuse_all_reduce_norm).
  absl::StatusOr<bool> AllReduceAddRmsNorm(const AddRmsNormArgs& args, CommDtype dtype,
                                           DeviceStream stream) override;
  absl::Status AllGather(const void* in, void* out, int64_t count, CommDtype dtype,
                         DeviceStream stream) override;
  absl::Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDtype dtype,
                                DeviceStream stream) override;
  absl::Status AllToAll(const void* in, absl::Span<const int64_t> send_counts, void* out,
                        absl::Span<const int64_t> recv_counts, CommDtype dtype,
                        DeviceStream stream) override;
  absl::Status Send(const void* data, int64_t count, CommDtype dtype, int peer,
                    DeviceStream stream) override;
  absl::Status Recv(void* data, int64_t count, CommDtype dtype, int peer,
                    DeviceStream stream) override;
  absl::Status Synchronize(DeviceStream stream) override;

 private:
  NcclCommunicator(int rank, int size, const NcclCommunicatorOptions& options)
      : rank_(rank), size_(size), options_(options) {}
  // Waits until NCCL has launched the call that returned `result`, within the deadline; records
  // (and aborts on) a failure.
  absl::Status Settle(const char* what, ncclResult_t result);
  // Records the group's first failure and aborts the communicator.
  absl::Status Fail(absl::Status error);
  absl::Status CheckUsable(int64_t count) const;

  const int rank_;
  const int size_;
  const NcclCommunicatorOptions options_;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<CustomAllReduce> custom_;
  std::string custom_off_;
  cudaEvent_t done_ = nullptr;  // Synchronize's marker
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool aborted_ = false;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_NCCL_COMMUNICATOR_H_
