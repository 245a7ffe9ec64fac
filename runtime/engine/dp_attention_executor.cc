#include "runtime/engine/dp_attention_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

ExecutorFactory DpAttentionExecutorFactory(ExecutorFactory local, comm::ProcessGroup* group) {
  ExecutorFactory factory = local;
  factory.name = absl::StrCat(local.name, " dp-attention");
  factory.dp_size = group->size();
  factory.verifies_drafts = false;
  factory.create = [local, group](
                       const ExecutorSpec& spec,
                       ModelWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    if (!spec.model_config.dp_attention) {
      return absl::InvalidArgumentError(
          "a data-parallel attention executor needs the rank's dp_attention model config");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> mine, local.create(spec, std::move(weights)));
    return std::unique_ptr<ModelExecutor>(new DpAttentionExecutor(
        std::move(mine), group, spec.model_config.vocab_size, spec.model_config.num_experts));
  };
  return factory;
}

DpAttentionExecutor::DpAttentionExecutor(std::unique_ptr<ModelExecutor> local,
                                         comm::ProcessGroup* group, int64_t vocab_size,
                                         int64_t num_experts)
    : local_(std::move(local)), group_(group), vocab_size_(vocab_size), num_experts_(num_experts) {}

absl::Status DpAttentionExecutor::Split(const SchedulerOutput& batch) {
  const int64_t n = group_->size(), me = group_->rank();
  mine_.seqs.clear();
  mine_.num_batched_tokens = 0;
  index_.clear();
  tables_.resize(batch.seqs.size());
  std::vector<int64_t> per_rank(n, 0);
  bool decode = true;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& seq = batch.seqs[i];
    if (seq.dp_rank < 0 || seq.dp_rank >= n) {
      return absl::InvalidArgumentError(absl::StrCat("request ", seq.request_id, " is on DP rank ",
                                                     seq.dp_rank, " of a group of ", n));
    }
    ++per_rank[seq.dp_rank];
    decode = decode && seq.new_tokens.size() == 1;
    if (seq.num_draft_tokens > 0) {
      return absl::InvalidArgumentError("speculative decoding does not run with --dp_attention");
    }
    if (seq.dp_rank != me) continue;
    std::vector<BlockId>& table = tables_[index_.size()];
    table.clear();
    for (const BlockId id : seq.block_table) {
      if (id % n != me) {
        return absl::InternalError(absl::StrCat("request ", seq.request_id, " of DP rank ", me,
                                                " holds block ", id, " of DP rank ", id % n));
      }
      table.push_back(static_cast<BlockId>(id / n));
    }
    ScheduledSeq local = seq;
    local.block_table = table;
    mine_.seqs.push_back(local);
    mine_.num_batched_tokens += static_cast<int64_t>(seq.new_tokens.size());
    index_.push_back(static_cast<int64_t>(i));
  }
  mine_.dp_decode_seqs = decode ? *std::max_element(per_rank.begin(), per_rank.end()) : 0;
  return absl::OkStatus();
}

absl::StatusOr<RunnerOutput> DpAttentionExecutor::Run(const SchedulerOutput& batch) {
  RETURN_IF_ERROR(Split(batch));
  last_local_seqs_ = static_cast<int64_t>(mine_.seqs.size());
  // An empty batch too: the model joins every MoE layer's collectives with no tokens of its own.
  ASSIGN_OR_RETURN(RunnerOutput local, local_->Run(mine_));

  // One all-reduce: [S] sampled token + 1 (0: none), the captured prompt logits of the step's
  // sequences in step order ([V] each), this step's routed tokens per expert ([E]). Each slot
  // has one non-zero contributor (its owner), so tokens (< 2^24), logits and counts pass exactly.
  const int64_t S = static_cast<int64_t>(batch.seqs.size()), V = vocab_size_, E = num_experts_;
  std::vector<int64_t> logits_at(S, -1);
  int64_t size = S;
  for (int64_t s = 0; s < S; ++s) {
    if (!batch.seqs[s].capture_prompt_logits) continue;
    logits_at[s] = size;
    size += V;
  }
  const int64_t counts_at = size;
  shared_.assign(size + E, 0.0f);
  for (size_t i = 0; i < index_.size(); ++i) {
    const int64_t s = index_[i];
    if (local.sampled_tokens[i] >= 0) shared_[s] = static_cast<float>(local.sampled_tokens[i] + 1);
    const std::vector<float>& row = local.last_prompt_logits[i];
    if (logits_at[s] >= 0 && static_cast<int64_t>(row.size()) == V) {
      std::copy(row.begin(), row.end(), shared_.begin() + logits_at[s]);
    }
  }
  const std::vector<uint64_t> counts = local_->stats().moe_expert_tokens;
  counted_.resize(E, 0);
  for (int64_t e = 0; e < E && e < static_cast<int64_t>(counts.size()); ++e) {
    shared_[counts_at + e] = static_cast<float>(counts[e] - counted_[e]);
    counted_[e] = counts[e];
  }
  RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(shared_)));

  RunnerOutput out;
  out.sampled_tokens.resize(S);
  out.last_prompt_logits.resize(S);
  out.draft_samples.resize(S);
  out.verify_logits.resize(S);
  for (int64_t s = 0; s < S; ++s) {
    out.sampled_tokens[s] = static_cast<int32_t>(shared_[s]) - 1;
    if (logits_at[s] >= 0) {
      out.last_prompt_logits[s].assign(shared_.begin() + logits_at[s],
                                       shared_.begin() + logits_at[s] + V);
    }
  }
  group_expert_tokens_.resize(E, 0);
  for (int64_t e = 0; e < E; ++e) {
    group_expert_tokens_[e] += static_cast<uint64_t>(shared_[counts_at + e]);
  }
  return out;
}

ExecutorStats DpAttentionExecutor::stats() const {
  ExecutorStats s = local_->stats();
  s.moe_expert_tokens = group_expert_tokens_;
  return s;
}

}  // namespace tandem::runtime
