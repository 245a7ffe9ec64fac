// KernelTrace: the kernels this process ran on its GPUs over a stretch of work, each with its
// device start / end time, through CUPTI's activity API (kernel records, CUDA graph nodes
// included, as Nsight Systems' `--cuda-graph-trace=node` shows them). For benchmarks
// (decode_step_bench --trace_steps): the device machines have no Nsight Systems.
//
// libcupti is opened at run time (dlopen of libcupti.so.13, then libcupti.so): nothing links it,
// and a machine without it gets UNAVAILABLE from Start. CUPTI's buffer callbacks carry no user
// pointer, so the one active trace of the process is reachable from them through a process-wide
// pointer: at most one KernelTrace exists at a time (Start refuses a second).
//
// Thread safety: Start / Stop from one thread; CUPTI's callbacks run on its own thread and hand
// finished buffers over under a mutex.
#ifndef TANDEM_RUNTIME_CUDA_KERNEL_TRACE_H_
#define TANDEM_RUNTIME_CUDA_KERNEL_TRACE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/cuda/step_breakdown.h"  // KernelRecord

namespace tandem::runtime::cuda {

class KernelTrace {
 public:
  // Starts recording every kernel launched from now on (FAILED_PRECONDITION while another
  // trace is active; UNAVAILABLE without libcupti or when CUPTI refuses). Start it before CUDA
  // graphs are captured: their replays are then recorded node by node. host_events: also every
  // memcpy on the device and every CUDA runtime call on the host (KernelRecord::Kind; for
  // BreakDownHostGaps; the calls' recording slows the host).
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start(bool host_events = false);
  // Stops recording.
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // CUPTI's clock (the records' time base), for marking a window.
  uint64_t Now() const;
  // The records of every kernel (and host event) that finished since the last call, sorted by start
  // time; the caller synchronizes the device first (CUPTI hands over only completed work).
  absl::StatusOr<std::vector<KernelRecord>> Collect();

  struct Impl;

 private:
  explicit KernelTrace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNEL_TRACE_H_
