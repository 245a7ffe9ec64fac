#include "runtime/parallel/plan_codec.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

void ToPlannedSeq(const ScheduledSeq& seq, bool with_block_table, tandem::v1::PlannedSeq* p) {
  p->set_request_id(seq.request_id);
  p->mutable_new_tokens()->Add(seq.new_tokens.begin(), seq.new_tokens.end());
  p->set_num_computed_tokens(seq.num_computed_tokens);
  if (with_block_table)
    p->mutable_block_table()->Add(seq.block_table.begin(), seq.block_table.end());
  p->set_samples(seq.samples);
  p->set_capture_prompt_logits(seq.capture_prompt_logits);
  p->set_temperature(seq.sampling.temperature);
  p->set_top_k(seq.sampling.top_k);
  p->set_top_p(seq.sampling.top_p);
  p->set_seed(seq.sampling.seed);
  p->set_vocab_limit(seq.sampling.vocab_limit);
  p->set_sample_step(seq.sample_step);
  p->set_num_draft_tokens(seq.num_draft_tokens);
  p->set_dp_rank(seq.dp_rank);
}

tandem::v1::StepPlan ToStepPlan(const SchedulerOutput& batch) {
  tandem::v1::StepPlan plan;
  plan.set_num_batched_tokens(batch.num_batched_tokens);
  for (const ScheduledSeq& seq : batch.seqs) ToPlannedSeq(seq, true, plan.add_seqs());
  return plan;
}

absl::Status FromPlannedSeq(const tandem::v1::PlannedSeq& p, ScheduledSeq* out) {
  ScheduledSeq& seq = *out;
  seq.request_id = p.request_id();
  seq.new_tokens = absl::MakeConstSpan(p.new_tokens().data(), p.new_tokens().size());
  seq.num_computed_tokens = p.num_computed_tokens();
  seq.block_table = absl::MakeConstSpan(p.block_table().data(), p.block_table().size());
  seq.samples = p.samples();
  seq.capture_prompt_logits = p.capture_prompt_logits();
  seq.sampling.temperature = p.temperature();
  seq.sampling.top_k = p.top_k();
  seq.sampling.top_p = p.top_p();
  seq.sampling.seed = p.seed();
  seq.sampling.vocab_limit = p.vocab_limit();
  seq.sample_step = p.sample_step();
  seq.num_draft_tokens = p.num_draft_tokens();
  seq.dp_rank = p.dp_rank();
  if (seq.num_draft_tokens < 0 ||
      (seq.num_draft_tokens > 0 &&
       seq.num_draft_tokens >= static_cast<int64_t>(seq.new_tokens.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("step plan: request ", seq.request_id, " has ",
                                                   seq.num_draft_tokens, " drafts in ",
                                                   seq.new_tokens.size(), " new tokens"));
  }
  if (seq.num_computed_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step plan: request ", seq.request_id, " has a negative start"));
  }
  return absl::OkStatus();
}

absl::Status FromStepPlan(tandem::v1::StepPlan plan, ReceivedStep* out) {
  out->plan = std::move(plan);
  out->batch = SchedulerOutput();
  out->batch.num_batched_tokens = out->plan.num_batched_tokens();
  for (const tandem::v1::PlannedSeq& p : out->plan.seqs()) {
    ScheduledSeq seq;
    RETURN_IF_ERROR(FromPlannedSeq(p, &seq));
    if (p.extends_held_table() || seq.block_table.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan: request ", seq.request_id, " has no block table"));
    }
    out->batch.seqs.push_back(seq);
  }
  return absl::OkStatus();
}

absl::Status BroadcastBytes(comm::ProcessGroup* group, std::string* bytes, int root_rank) {
  const bool root = group->rank() == root_rank;
  int64_t size = root ? static_cast<int64_t>(bytes->size()) : 0;
  if (root && size > kMaxRankCommandBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank command of ", size, " bytes exceeds the limit of ", kMaxRankCommandBytes));
  }
  char header[8];
  std::memcpy(header, &size, sizeof(size));  // little-endian hosts only (x86-64, aarch64)
  RETURN_IF_ERROR(group->Broadcast(absl::MakeSpan(header, sizeof(header)), root_rank));
  std::memcpy(&size, header, sizeof(size));
  if (size < 0 || size > kMaxRankCommandBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank command frame of ", size, " bytes is over the limit of ", kMaxRankCommandBytes));
  }
  if (!root) bytes->resize(static_cast<size_t>(size));
  if (size == 0) return absl::OkStatus();
  return group->Broadcast(absl::MakeSpan(bytes->data(), bytes->size()), root_rank);
}

absl::StatusOr<std::vector<std::string>> GatherBytes(comm::ProcessGroup* group,
                                                     const std::string& mine) {
  std::vector<std::string> all(static_cast<size_t>(group->size()));
  for (int r = 0; r < group->size(); ++r) {
    if (r == group->rank()) all[r] = mine;
    RETURN_IF_ERROR(BroadcastBytes(group, &all[r], r));
  }
  return all;
}

absl::Status SendCommand(comm::ProcessGroup* group, const tandem::v1::RankCommand& command) {
  std::string bytes;
  if (!command.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize a rank command");
  }
  return BroadcastBytes(group, &bytes);
}

absl::StatusOr<tandem::v1::RankCommand> ReceiveCommand(comm::ProcessGroup* group) {
  std::string bytes;
  RETURN_IF_ERROR(BroadcastBytes(group, &bytes));
  tandem::v1::RankCommand command;
  if (!command.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("rank command does not parse");
  }
  return command;
}

}  // namespace tandem::runtime
