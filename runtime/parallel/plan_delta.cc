#include "runtime/parallel/plan_delta.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

tandem::v1::StepPlan PlanDeltaEncoder::Encode(const SchedulerOutput& batch) {
  tandem::v1::StepPlan plan;
  plan.set_num_batched_tokens(batch.num_batched_tokens);
  absl::flat_hash_map<int64_t, std::vector<int32_t>> next;
  next.reserve(batch.seqs.size());
  for (const ScheduledSeq& seq : batch.seqs) {
    tandem::v1::PlannedSeq* p = plan.add_seqs();
    auto held = sent_.find(seq.request_id);
    const bool extends =
        held != sent_.end() && held->second.size() <= seq.block_table.size() &&
        std::equal(held->second.begin(), held->second.end(), seq.block_table.begin());
    ToPlannedSeq(seq, /*with_block_table=*/!extends, p);
    std::vector<int32_t> table;
    if (extends) {
      table = std::move(held->second);
      p->set_extends_held_table(true);
      p->set_num_held_blocks(static_cast<int64_t>(table.size()));
      p->mutable_new_block_ids()->Add(seq.block_table.begin() + table.size(),
                                      seq.block_table.end());
      table.insert(table.end(), seq.block_table.begin() + table.size(), seq.block_table.end());
    } else {
      table.assign(seq.block_table.begin(), seq.block_table.end());
    }
    if (held != sent_.end()) sent_.erase(held);  // a repeated id would then go whole
    next[seq.request_id] = std::move(table);
  }
  sent_ = std::move(next);
  return plan;
}

int64_t PlanDeltaEncoder::held_blocks() const {
  int64_t n = 0;
  for (const auto& [id, table] : sent_) n += static_cast<int64_t>(table.size());
  return n;
}

absl::Status PlanDeltaDecoder::Apply(tandem::v1::StepPlan plan, ReceivedStep* out) {
  out->plan = std::move(plan);
  out->batch = SchedulerOutput();
  out->batch.num_batched_tokens = out->plan.num_batched_tokens();
  absl::flat_hash_map<int64_t, std::vector<int32_t>> next;
  next.reserve(out->plan.seqs_size());
  for (const tandem::v1::PlannedSeq& p : out->plan.seqs()) {
    ScheduledSeq seq;
    RETURN_IF_ERROR(FromPlannedSeq(p, &seq));
    if (next.contains(seq.request_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan: request ", seq.request_id, " appears twice"));
    }
    std::vector<int32_t> table;
    if (p.extends_held_table()) {
      auto held = held_.find(seq.request_id);
      if (held == held_.end() || static_cast<int64_t>(held->second.size()) != p.num_held_blocks()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step plan: request ", seq.request_id, " extends a table of ", p.num_held_blocks(),
            " blocks, this rank holds ",
            held == held_.end() ? std::string("none") : absl::StrCat(held->second.size()),
            " (rank plans out of step)"));
      }
      table = std::move(held->second);
      table.insert(table.end(), p.new_block_ids().begin(), p.new_block_ids().end());
    } else {
      table.assign(p.block_table().begin(), p.block_table().end());
    }
    if (table.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan: request ", seq.request_id, " has no block table"));
    }
    next[seq.request_id] = std::move(table);
    out->batch.seqs.push_back(seq);
  }
  held_ = std::move(next);
  // The tables are final (a vector's storage stays put when the map moves it): view them.
  for (ScheduledSeq& seq : out->batch.seqs) seq.block_table = held_.at(seq.request_id);
  return absl::OkStatus();
}

}  // namespace tandem::runtime
