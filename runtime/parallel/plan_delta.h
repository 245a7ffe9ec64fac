// Block-table deltas for the rank plan (vLLM's `new_block_ids`): rank 0 sends each request's
// block table whole once, then only the block ids appended since; every follower keeps the
// tables of the last step's requests and rebuilds the whole table from what it holds.
//
// The two sides hold the same set: the requests of the last plan sent. Rank 0's encoder
// compares each request's table with the one it last sent: when that is a prefix, the plan
// carries only the new ids (and the prefix length, which the follower checks); otherwise (a new
// request, a preempted one back with other blocks, anything that is not an append) the whole
// table. A request missing from a step is dropped on both sides, so no "finished" list is
// needed and both sides hold at most one step's requests; one that comes back is sent whole.
// The result is exact whatever the scheduler does with tables: the follower's tables always
// equal the ones rank 0 planned (plan_delta_test plays a randomized schedule against it).
//
// Sizes (plan_delta_test): a decode step of 64 requests at 32k tokens each (block size 16,
// 2048 blocks each) is ~400 KiB whole, over the 256 KiB shared-memory slot; as deltas ~2 KiB.
//
// Thread safety: not thread-safe; one encoder per GroupExecutor, one decoder per follower loop.
// The encoder's state must follow the plans that reached the followers: after a step that
// failed (its plan may not have gone out) the caller Reset()s it. A decoder that returned an
// error is unusable (the follower exits with it).
#ifndef TANDEM_RUNTIME_PARALLEL_PLAN_DELTA_H_
#define TANDEM_RUNTIME_PARALLEL_PLAN_DELTA_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "runtime/engine/scheduler.h"
#include "runtime/parallel/plan_codec.h"
#include "tandem/v1/rank_plan.pb.h"

namespace tandem::runtime {

// Rank 0's side.
class PlanDeltaEncoder {
 public:
  // The plan of `batch` against what the followers hold, and the held set updated to it.
  // REQUIRES: distinct request ids in `batch` (the scheduler's).
  tandem::v1::StepPlan Encode(const SchedulerOutput& batch);
  // Block ids held for the followers (the last plan's tables).
  int64_t held_blocks() const;
  // Forgets the held set: the next plan sends every table whole (which the followers take in
  // place of whatever they hold). For a plan that may not have reached them.
  void Reset() { sent_.clear(); }

 private:
  absl::flat_hash_map<int64_t, std::vector<int32_t>> sent_;
};

// A follower's side.
class PlanDeltaDecoder {
 public:
  // `plan` viewed as the SchedulerOutput rank 0 planned: block tables rebuilt from the held ones.
  // Spans point into out->plan and into this decoder: valid until the next Apply. The held set
  // becomes this plan's tables. FAILED_PRECONDITION when a delta does not match what is held
  // (the two sides are out of step: the group must not go on); INVALID_ARGUMENT for a malformed
  // plan (a repeated request id, a sequence without a block table).
  absl::Status Apply(tandem::v1::StepPlan plan, ReceivedStep* out);

 private:
  absl::flat_hash_map<int64_t, std::vector<int32_t>> held_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_PLAN_DELTA_H_
