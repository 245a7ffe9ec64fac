#include "runtime/engine/model_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

absl::Status ModelExecutor::Launch(const SchedulerOutput& batch) {
  // The fed tokens that the previous step sampled, in storage the copied batch points at.
  std::vector<int32_t> fed(batch.seqs.size(), 0);
  SchedulerOutput resolved = batch;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    ScheduledSeq& seq = resolved.seqs[i];
    if (seq.input_from_prev_seq < 0) continue;
    if (seq.new_tokens.size() != 1 ||
        seq.input_from_prev_seq >= static_cast<int64_t>(last_sampled_.size()) ||
        last_sampled_[seq.input_from_prev_seq] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", seq.request_id, " feeds sequence ", seq.input_from_prev_seq,
          "'s sample of the previous step, which has none (", last_sampled_.size(), " sequences)"));
    }
    fed[i] = last_sampled_[seq.input_from_prev_seq];
    seq.new_tokens = absl::MakeConstSpan(&fed[i], 1);
    seq.input_from_prev_seq = -1;  // Run() sees a plain step
  }
  ASSIGN_OR_RETURN(RunnerOutput out, Run(resolved));
  last_sampled_ = out.sampled_tokens;
  launched_.push_back(std::move(out));
  return absl::OkStatus();
}

absl::StatusOr<RunnerOutput> ModelExecutor::Collect() {
  if (launched_.empty()) return absl::FailedPreconditionError("Collect() without a launched step");
  RunnerOutput out = std::move(launched_.front());
  launched_.pop_front();
  return out;
}

}  // namespace tandem::runtime
