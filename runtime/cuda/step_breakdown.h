// Where a window of decode steps spends its GPU time, from kernel records (KernelTrace): the
// time per kernel class (the projections' GEMVs told apart by their place in the layer, the
// all-reduces, attention, norms, RoPE, sampling), how much of the window some kernel was running,
// and the gaps. For decode_step_bench --trace_steps; pure functions, CPU-tested.
#ifndef TANDEM_RUNTIME_CUDA_STEP_BREAKDOWN_H_
#define TANDEM_RUNTIME_CUDA_STEP_BREAKDOWN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::runtime::cuda {

// One kernel's run on the device (KernelTrace's records), or, with KernelTrace::Start(true), a
// copy on the device or a CUDA runtime call on the host (same clock).
struct KernelRecord {
  enum class Kind { kKernel, kMemcpy, kApi };
  std::string name;  // demangled where possible; "memcpy HtoD" / "memcpy DtoH" / "memcpy";
                     // a runtime call's CUPTI name ("cudaGraphLaunch_v10000")
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t grid_x = 0;
  uint32_t block_x = 0;
  Kind kind = Kind::kKernel;
  uint32_t api_result = 0;  // a runtime call's return value (0: cudaSuccess)
};

// The class of a kernel by its demangled name, given the class of the kernel launched before it
// (the batch-1 GEMV kernel serves q/k/v, o, down and lm_head alike: o follows attention, down
// follows the gate_up GEMV, lm_head writes fp32 logits; the rest is qkv).
std::string KernelClass(std::string_view name, std::string_view previous);

struct KernelClassTime {
  std::string name;
  int64_t calls = 0;
  // Sum of the kernels' durations. A kernel launched early under PDL sits in griddepcontrol.wait
  // until its predecessor completes, and that wait counts in its duration.
  double total_us = 0.0;
  // The time the kernels ran while no earlier kernel did (end - max(start, the latest end of the
  // kernels before it)): the busy time partitioned in stream order, PDL waits left out.
  double exclusive_us = 0.0;
};

struct StepBreakdown {
  int steps = 0;
  std::vector<KernelClassTime> classes;  // largest exclusive time first
  double kernel_us = 0.0;  // every kernel's duration summed (PDL overlaps counted twice)
  double busy_us = 0.0;    // time some kernel was running (union of the intervals)
  double span_us = 0.0;    // first start to last end
  // No kernel running: before a step's first kernel (the embedding; host work, the step's
  // copies, the graph launch) and within a step (between two kernels).
  double idle_between_steps_us = 0.0;
  double idle_within_steps_us = 0.0;
};

// Records of `steps` steps (sorted by start; KernelTrace::Collect's order).
StepBreakdown BreakDownSteps(const std::vector<KernelRecord>& records, int steps);

// The GPU's idle time before each step's first kernel (the embedding) split by what the host and
// the copies did, from kernel, memcpy and runtime-call records (KernelTrace::Start(true)): the
// last kernel of the step before -> its DtoH copy (the sampled tokens) done -> the host sees it
// (the first synchronising call that returns success after the copy: cudaEventQuery /
// cudaStreamSynchronize / cudaEventSynchronize) -> the next step's first cudaMemcpyAsync (the
// metadata upload: engine update, scheduling and packing happened in between) ->
// cudaGraphLaunch called -> it returned -> the step's first kernel starts. A boundary where a mark
// is missing (eager steps: no cudaGraphLaunch) puts the rest of its gap in `unresolved_us`.
struct HostGapBreakdown {
  int gaps = 0;                      // step boundaries seen (every embedding but the first)
  double total_us = 0.0;             // the idle time of those boundaries
  double copy_out_us = 0.0;          // last kernel end -> DtoH copy end
  double wake_us = 0.0;              // -> the host's synchronising call returned
  double host_us = 0.0;              // -> the next step's first cudaMemcpyAsync starts
  double upload_us = 0.0;            // -> cudaGraphLaunch starts (upload call, planning)
  double launch_call_us = 0.0;       // cudaGraphLaunch's own duration
  double launch_to_kernel_us = 0.0;  // its return -> the first kernel starts
  double unresolved_us = 0.0;
};
HostGapBreakdown BreakDownHostGaps(const std::vector<KernelRecord>& records);
std::string FormatHostGaps(const HostGapBreakdown& g);

// A table: per class calls and microseconds per step and the share of `step_ms` (the measured
// step time), then busy and idle time per step.
std::string FormatBreakdown(const StepBreakdown& b, double step_ms);

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_STEP_BREAKDOWN_H_
