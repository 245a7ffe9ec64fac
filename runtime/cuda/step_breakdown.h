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

// One kernel's run on the device (KernelTrace's records).
struct KernelRecord {
  std::string name;  // demangled where possible
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t grid_x = 0;
  uint32_t block_x = 0;
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

// A table: per class calls and microseconds per step and the share of `step_ms` (the measured
// step time), then busy and idle time per step.
std::string FormatBreakdown(const StepBreakdown& b, double step_ms);

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_STEP_BREAKDOWN_H_
