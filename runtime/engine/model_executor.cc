#include "runtime/engine/model_executor.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

absl::StatusOr<std::vector<HiddenRowRun>> InputHiddenRuns(const SchedulerOutput& batch,
                                                          int64_t hidden) {
  std::vector<HiddenRowRun> runs;
  auto add = [&runs](int64_t dst, int64_t src, int64_t rows, bool zero) {
    if (rows <= 0) return;
    if (!runs.empty() && runs.back().zero == zero) {
      runs.back().rows += rows;  // adjacent in the step and, for given rows, in input_hidden
      return;
    }
    runs.push_back({dst, src, rows, zero});
  };
  int64_t dst = 0, src = 0;
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    if (seq.zero_hidden_rows < 0 || seq.zero_hidden_rows > n) {
      return absl::InvalidArgumentError(absl::StrCat("request ", seq.request_id, " has ",
                                                     seq.zero_hidden_rows, " zero hidden rows for ",
                                                     n, " fed tokens"));
    }
    add(dst, src, seq.zero_hidden_rows, /*zero=*/true);
    add(dst + seq.zero_hidden_rows, src, n - seq.zero_hidden_rows, /*zero=*/false);
    dst += n;
    src += n - seq.zero_hidden_rows;
  }
  if (static_cast<int64_t>(batch.input_hidden.size()) != src * hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("the MTP layer's step needs input hidden states [", src, ", ", hidden, "] (",
                     dst, " fed tokens, ", dst - src, " of them zero rows), got ",
                     batch.input_hidden.size(), " values"));
  }
  return runs;
}

std::vector<int64_t> LastTokenRows(const SchedulerOutput& batch) {
  std::vector<int64_t> rows;
  rows.reserve(batch.seqs.size());
  int64_t end = 0;
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    end += n;
    rows.push_back(n > 0 ? end - 1 : -1);
  }
  return rows;
}

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
