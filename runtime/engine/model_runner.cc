#include "runtime/engine/model_runner.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/sampling/sampling.h"
#include "runtime/kv_cache/dcp_blocks.h"

namespace tandem::runtime {

ExecutorFactory CpuExecutorFactory(int num_threads, comm::ProcessGroup* group, int64_t dcp_size,
                                   int64_t dcp_interleave, KvDtype kv_dtype) {
  ExecutorFactory factory;
  factory.name = kv_dtype == KvDtype::kFp8E4m3 ? "cpu:fp8-kv" : "cpu";
  factory.kv_dtype = kv_dtype;
  factory.accepts_external_pool = true;
  factory.verifies_drafts = true;
  factory.dcp_size = dcp_size;
  factory.dcp_interleave = dcp_interleave;
  factory.create = [num_threads, group, dcp_size, dcp_interleave, kv_dtype](
                       const ExecutorSpec& spec,
                       ModelWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    if (num_threads <= 0) return absl::InvalidArgumentError("num_threads must be positive");
    auto thread_pool = std::make_unique<kernels::ThreadPool>(num_threads);
    kernels::DcpShard dcp;
    if (dcp_size > 1) {
      dcp = DcpBlockLayout::FromFlags(dcp_size, dcp_interleave, spec.block_size)
                .ShardForTpRank(group == nullptr ? 0 : group->rank());
    }
    // LlamaModel, or MlaModel for DeepSeek multi-head latent attention (cpu_model.h).
    const bool fp8 = kv_dtype == KvDtype::kFp8E4m3;
    if (!fp8 && kv_dtype != KvDtype::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CPU backend keeps KV in float32 or FP8, not ", KvDtypeName(kv_dtype)));
    }
    ASSIGN_OR_RETURN(
        std::unique_ptr<CpuModel> model,
        MakeCpuModel(spec.model_config, std::move(weights), thread_pool.get(), group, dcp, fp8));
    const kernels::KvCacheLayout layout = model->KvLayout(spec.num_blocks, spec.block_size);
    RETURN_IF_ERROR(layout.Validate());
    if (fp8 && layout.num_planes == 1) RETURN_IF_ERROR(CheckFp8LatentPool(layout));
    if (spec.kv_pool != nullptr && reinterpret_cast<uintptr_t>(spec.kv_pool) % alignof(float)) {
      return absl::InternalError("KV pool memory is not float-aligned");
    }
    return std::unique_ptr<ModelExecutor>(new ModelRunner(std::move(model), layout,
                                                          static_cast<float*>(spec.kv_pool),
                                                          std::move(thread_pool), kv_dtype));
  };
  return factory;
}

int64_t ModelRunner::PoolBytes(const kernels::KvCacheLayout& layout, KvDtype kv_dtype) {
  // FP8 latent (kv_layout.h, Fp8LatentBlocks; one plane): each block's codes, then its fp32
  // row scales. FP8 K / V (two planes): the codes alone, the scales per tensor.
  if (kv_dtype != KvDtype::kFp8E4m3) return layout.TotalElems() * int64_t{sizeof(float)};
  return layout.TotalElems() +
         (layout.num_planes == 1 ? layout.TotalElems() / layout.head_dim * 4 : 0);
}

ModelRunner::ModelRunner(std::unique_ptr<CpuModel> model, kernels::KvCacheLayout layout,
                         float* kv_pool, std::unique_ptr<kernels::ThreadPool> thread_pool,
                         KvDtype kv_dtype)
    : thread_pool_(std::move(thread_pool)),
      model_(std::move(model)),
      layout_(layout),
      kv_dtype_(kv_dtype),
      kv_pool_(kv_pool) {
  const int64_t bytes = PoolBytes(layout, kv_dtype);
  if (kv_pool_ == nullptr) {
    owned_pool_.assign((bytes + 3) / 4, 0.0f);  // whole floats: 4-byte aligned FP8 scales too
    kv_pool_ = owned_pool_.data();
  } else {
    std::memset(kv_pool_, 0, static_cast<size_t>(bytes));
  }
}

absl::StatusOr<RunnerOutput> ModelRunner::Run(const SchedulerOutput& batch) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  std::vector<int64_t> logit_row_of_seq(S, -1);
  const int64_t max_blocks = BuildStepMetadata(batch, &logit_row_of_seq);
  const kernels::DcpShard& dcp = model_->dcp();

  ForwardInput input;
  input.token_ids = token_ids_;
  input.positions = positions_;
  input.slot_mapping = slot_mapping_;
  input.attention.query_start_loc = query_start_loc_.data();
  input.attention.seq_lens = seq_lens_.data();
  input.attention.block_tables = block_tables_.data();
  input.attention.local_seq_lens = dcp.size > 1 ? local_seq_lens_.data() : nullptr;
  input.attention.num_seqs = S;
  input.attention.max_blocks_per_seq = max_blocks;
  kernels::KvCacheView cache{kv_pool_, layout_};
  RunnerOutput out;
  std::vector<float> input_hidden;
  RETURN_IF_ERROR(ExpandInputHidden(batch, &input_hidden));
  input.input_hidden = input_hidden.empty() ? batch.input_hidden : input_hidden;
  if (batch.return_hidden_states) input.hidden_out = &out.hidden_states;
  RETURN_IF_ERROR(model_->Forward(input, cache, logit_rows_, &logits_));
  if (batch.return_hidden_states && batch.return_last_hidden_only) KeepLastHidden(batch, &out);
  SampleFromLogits(batch, logit_row_of_seq, &out);
  return out;
}

int64_t ModelRunner::BuildStepMetadata(const SchedulerOutput& batch,
                                       std::vector<int64_t>* logit_row_of_seq) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  const int64_t bs = layout_.block_size;
  if (model_->dcp().size > 1) BuildDcpTables(batch);
  int64_t max_blocks = 1;
  for (int64_t s = 0; s < S; ++s) {
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(Table(batch, s).size()));
  }
  token_ids_.clear();
  positions_.clear();
  slot_mapping_.clear();
  logit_rows_.clear();
  query_start_loc_.assign(1, 0);
  seq_lens_.clear();
  block_tables_.assign(S * max_blocks, 0);
  const kernels::DcpShard& dcp = model_->dcp();
  local_seq_lens_.clear();
  for (int64_t s = 0; s < S; ++s) {
    const ScheduledSeq& seq = batch.seqs[s];
    const absl::Span<const BlockId> table = Table(batch, s);
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = seq.num_computed_tokens + j;
      token_ids_.push_back(seq.new_tokens[j]);
      positions_.push_back(pos);
      // With DCP only the shard holding the token writes it, at its local index.
      const bool mine = dcp.size == 1 || kernels::DcpRankOf(pos, dcp) == dcp.rank;
      const int64_t local = dcp.size == 1 ? pos : kernels::DcpLocalCount(pos, dcp);
      slot_mapping_.push_back(mine ? int64_t{table[local / bs]} * bs + local % bs : -1);
    }
    query_start_loc_.push_back(static_cast<int32_t>(token_ids_.size()));
    seq_lens_.push_back(static_cast<int32_t>(seq.num_computed_tokens + n));
    local_seq_lens_.push_back(
        static_cast<int32_t>(kernels::DcpLocalCount(seq.num_computed_tokens + n, dcp)));
    std::copy(table.begin(), table.end(), block_tables_.begin() + s * max_blocks);
    if (seq.samples || seq.capture_prompt_logits) {
      // A verify pass samples at its last token and at every draft: rows first .. first + K.
      (*logit_row_of_seq)[s] = static_cast<int64_t>(logit_rows_.size());
      const int64_t k = seq.samples ? seq.num_draft_tokens : 0;
      for (int64_t j = k; j >= 0; --j) {
        logit_rows_.push_back(static_cast<int64_t>(token_ids_.size()) - 1 - j);
      }
    }
  }
  return max_blocks;
}

void ModelRunner::SampleFromLogits(const SchedulerOutput& batch,
                                   absl::Span<const int64_t> logit_row_of_seq,
                                   RunnerOutput* out) const {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  const int64_t vocab = model_->config().vocab_size;
  out->sampled_tokens.assign(S, -1);
  out->last_prompt_logits.resize(S);
  out->draft_samples.resize(S);
  out->verify_logits.resize(S);
  for (int64_t s = 0; s < S; ++s) {
    const ScheduledSeq& seq = batch.seqs[s];
    const int64_t k = seq.samples ? seq.num_draft_tokens : 0;
    const int64_t first = logit_row_of_seq[s];
    if (first < 0) continue;
    if (seq.return_verify_logits && k > 0) {
      out->verify_logits[s].assign(logits_.data() + first * vocab,
                                   logits_.data() + (first + k + 1) * vocab);
    }
    for (int64_t j = 0; j < k; ++j) {
      out->draft_samples[s].push_back(
          kernels::cpu::SampleToken(logits_.data() + (first + j) * vocab, vocab, seq.sampling,
                                    static_cast<uint64_t>(seq.sample_step + j)));
    }
    const int64_t row = first + k;
    const float* logits = logits_.data() + row * vocab;
    if (seq.capture_prompt_logits) out->last_prompt_logits[s].assign(logits, logits + vocab);
    if (seq.samples) {
      out->sampled_tokens[s] = kernels::cpu::SampleToken(
          logits, vocab, seq.sampling, static_cast<uint64_t>(seq.sample_step + k));
    }
  }
}

absl::Status ModelRunner::ExpandInputHidden(const SchedulerOutput& batch,
                                            std::vector<float>* rows) const {
  const bool zeros = std::any_of(batch.seqs.begin(), batch.seqs.end(),
                                 [](const ScheduledSeq& seq) { return seq.zero_hidden_rows != 0; });
  if (!zeros) return absl::OkStatus();  // input_hidden as given
  const int64_t H = model_->config().hidden_size;
  ASSIGN_OR_RETURN(const std::vector<HiddenRowRun> runs, InputHiddenRuns(batch, H));
  const HiddenRowRun& last = runs.back();
  rows->assign(static_cast<size_t>((last.dst_row + last.rows) * H), 0.0f);
  for (const HiddenRowRun& run : runs) {
    if (run.zero) continue;
    std::copy_n(batch.input_hidden.begin() + run.src_row * H, run.rows * H,
                rows->begin() + run.dst_row * H);
  }
  return absl::OkStatus();
}

void ModelRunner::KeepLastHidden(const SchedulerOutput& batch, RunnerOutput* out) const {
  const int64_t H = model_->config().hidden_size;
  const std::vector<int64_t> rows = LastTokenRows(batch);
  std::vector<float> last(rows.size() * static_cast<size_t>(H), 0.0f);
  for (size_t s = 0; s < rows.size(); ++s) {
    if (rows[s] < 0 || (rows[s] + 1) * H > static_cast<int64_t>(out->hidden_states.size())) {
      continue;
    }
    std::copy_n(out->hidden_states.begin() + rows[s] * H, H, last.begin() + s * H);
  }
  out->hidden_states = std::move(last);
}

void ModelRunner::BuildDcpTables(const SchedulerOutput& batch) {
  const kernels::DcpShard& dcp = model_->dcp();
  const DcpBlockLayout blocks{dcp.size, dcp.interleave, layout_.block_size};
  local_tables_.resize(batch.seqs.size());
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    local_tables_[s].clear();
    blocks.ShardLocalBlocks(batch.seqs[s].block_table, dcp.rank,
                            std::back_inserter(local_tables_[s]));
  }
}

absl::Span<const BlockId> ModelRunner::Table(const SchedulerOutput& batch, int64_t s) const {
  if (model_->dcp().size == 1) return batch.seqs[s].block_table;
  return local_tables_[s];
}

}  // namespace tandem::runtime
