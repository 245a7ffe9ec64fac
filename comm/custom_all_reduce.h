// CustomAllReduce: a one-shot / two-shot all-reduce for small messages between the GPUs of one
// host over CUDA IPC (vLLM's custom all-reduce design; our own kernels): each rank's IPC buffer
// (flags, two staging halves, a result buffer) is allocated and exchanged once at creation, and
// every call is ONE kernel that copies its input into its staging buffer, meets its peers at a
// per-block flag barrier and reads their buffers over NVLink (custom_all_reduce_layout.h: paths,
// shapes, pack assignment; comm/README.md, "All-reduce paths"). The kernel's arguments are fixed
// device pointers and its flag counters live in device memory, so calls can be captured in a
// CUDA graph and replayed.
//
// A peer that never arrives does not hang the device: a waiting block gives up after the
// timeout (%globaltimer) and raises a flag the host reads in Aborted(); the owner then fails the
// group (NcclCommunicator::Synchronize).
//
// Thread safety: one thread issues the calls (as DeviceCommunicator).
#ifndef TANDEM_COMM_CUSTOM_ALL_REDUCE_H_
#define TANDEM_COMM_CUSTOM_ALL_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/custom_all_reduce_layout.h"
#include "comm/device_communicator.h"
#include "comm/process_group.h"

namespace tandem::comm {

struct CustomAllReduceOptions {
  int device = 0;
  ArLimits limits;
  absl::Duration timeout = absl::Seconds(30);  // a block's wait for its peers
  // Launch the kernels with programmatic dependent launch: each waits for its predecessor's
  // completion on the device (griddepcontrol.wait) instead of in the launch, and lets its
  // successor launch once its barrier is passed (the next GEMV's launch overlaps the reads).
  bool programmatic_launch = true;
};

class CustomAllReduce {
 public:
  // Collective over `group` (every rank, its own device). Null (on every rank alike, with the
  // reason in *why_not) when the group cannot use it: world not 2/4/8, ranks on more than one
  // host, two ranks on one device, no peer access between some pair, or an IPC call failing on
  // any rank. Errors: the group's (a rank missing).
  static absl::StatusOr<std::unique_ptr<CustomAllReduce>> Create(
      ProcessGroup* group, const CustomAllReduceOptions& options, std::string* why_not);
  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  // The path for `bytes` (kNccl: the caller takes another path).
  ArLaunch Plan(int64_t bytes) const;
  // out[i] = sum over ranks of in[i] (count elements of dtype; in == out allowed), enqueued on
  // `stream` as planned by Plan(count * element size), which must not be kNccl; every rank
  // makes the same calls in the same order.
  absl::Status AllReduce(const void* in, void* out, int64_t count, CommDtype dtype,
                         cudaStream_t stream);
  // The fused all-reduce + residual add + RMSNorm (AddRmsNormArgs, device_communicator.h) in ONE
  // kernel of the one-shot kind with whole rows per cluster of blocks (PlanAllReduceNorm):
  // bit-identical to AllReduce followed by kernels::cuda::FusedAddRmsNorm (RmsNorm without the
  // add). False, nothing enqueued, where the plan is not fused (size past one-shot, fp32, rows not
  // whole packs) or a pointer is not 16-byte aligned. Every rank makes the same calls in the same
  // order.
  absl::StatusOr<bool> AllReduceAddRmsNorm(const AddRmsNormArgs& args, CommDtype dtype,
                                           cudaStream_t stream);
  // True once a kernel gave up waiting for a peer (the group is then broken).
  bool Aborted() const;

 private:
  CustomAllReduce(int rank, int world, const CustomAllReduceOptions& options)
      : rank_(rank), world_(world), options_(options) {}
  // Bytes of one rank's IPC allocation for messages of up to `max_bytes` (the kernels' layout:
  // signal flags, two staging halves, the two-shot result; custom_all_reduce.cu).
  static int64_t AllocationBytes(int64_t max_bytes);

  const int rank_;
  const int world_;
  const CustomAllReduceOptions options_;
  void* own_ = nullptr;                 // this rank's IPC allocation
  std::vector<void*> peers_;            // every rank's allocation as mapped here (own_ at rank_)
  volatile int* abort_host_ = nullptr;  // mapped pinned flag the kernels raise
  int* abort_device_ = nullptr;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_CUSTOM_ALL_REDUCE_H_
