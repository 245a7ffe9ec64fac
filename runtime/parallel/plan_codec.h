// The messages rank 0 of a worker group broadcasts to its other ranks (RankCommand in
// proto/tandem/v1/rank_plan.proto): a step's plan to and from SchedulerOutput, and framing over
// ProcessGroup::Broadcast (an 8-byte length, then the bytes; one collective each).
//
// Thread safety: functions are thread-safe; a ProcessGroup's collectives are not (one caller).
#ifndef TANDEM_RUNTIME_PARALLEL_PLAN_CODEC_H_
#define TANDEM_RUNTIME_PARALLEL_PLAN_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "runtime/engine/scheduler.h"
#include "tandem/v1/rank_plan.pb.h"

namespace tandem::runtime {

// A plan larger than this is refused by both sides (a step's plan is ~ (tokens + blocks) * 4
// bytes: 2048 tokens and 256 sequences of 8k context are ~0.6 MiB).
inline constexpr int64_t kMaxRankCommandBytes = int64_t{64} << 20;

// The whole plan: every sequence with its whole block table (PlanDeltaEncoder, plan_delta.h,
// sends only what a follower does not hold yet).
tandem::v1::StepPlan ToStepPlan(const SchedulerOutput& batch);
// One sequence's fields; its block table only when `with_block_table`.
void ToPlannedSeq(const ScheduledSeq& seq, bool with_block_table, tandem::v1::PlannedSeq* out);
// `p` viewed as a ScheduledSeq (spans into `p`; block_table is p.block_table(), possibly empty).
// INVALID_ARGUMENT for a negative start or drafts that are not among the new tokens.
absl::Status FromPlannedSeq(const tandem::v1::PlannedSeq& p, ScheduledSeq* out);

// A received plan and the SchedulerOutput viewing it (its spans point into `plan`: keep both
// together, do not copy one without the other).
struct ReceivedStep {
  tandem::v1::StepPlan plan;
  SchedulerOutput batch;
};
// A whole plan (ToStepPlan's). INVALID_ARGUMENT when a sequence has no block table (or a delta).
absl::Status FromStepPlan(tandem::v1::StepPlan plan, ReceivedStep* out);

// Rank `root`: broadcasts `bytes`. Other ranks: receive the root's. Errors of the group;
// INVALID_ARGUMENT for a frame over kMaxRankCommandBytes (the receiver cannot follow: the group
// is unusable afterwards, and the caller fails).
absl::Status BroadcastBytes(comm::ProcessGroup* group, std::string* bytes, int root = 0);

// Every rank calls it with its `mine`; every rank gets all of them in rank order (one broadcast
// per rank: for small replies, e.g. KV transfer states).
absl::StatusOr<std::vector<std::string>> GatherBytes(comm::ProcessGroup* group,
                                                     const std::string& mine);

absl::Status SendCommand(comm::ProcessGroup* group, const tandem::v1::RankCommand& command);
absl::StatusOr<tandem::v1::RankCommand> ReceiveCommand(comm::ProcessGroup* group);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_PLAN_CODEC_H_
