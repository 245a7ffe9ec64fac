// Executes a scheduled step: builds the batch metadata once (token ids, positions, slot
// mapping, query_start_loc, seq_lens, block tables), runs the model, samples.
//
// The runner owns the KV pool memory and the model; it makes no policy decisions.
// Thread safety: not thread-safe; called from the engine's step loop.
#ifndef TANDEM_RUNTIME_ENGINE_MODEL_RUNNER_H_
#define TANDEM_RUNTIME_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/llama_model.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/model_executor.h"
#include "runtime/engine/scheduler.h"

namespace tandem::runtime {

// The CPU backend: fp32 weights and KV, `num_threads` compute threads. With a tensor-parallel
// `group` (size > 1; outliving the executors) the model is the group's rank's shard (LlamaModel).
// dcp_size > 1: decode context parallelism over the group (ExecutorFactory::dcp_size; the rank
// is KV shard group->rank() % dcp_size); dcp_interleave 0 = the block size. kv_dtype kF32, or
// kFp8E4m3: a DeepSeek MLA model's FP8 latent pool (kv_layout.h, Fp8LatentPool), or another
// model's FP8 K / V pool (e4m3 codes, one scale per tensor: kernels/attention Fp8KvCacheView).
ExecutorFactory CpuExecutorFactory(int num_threads, comm::ProcessGroup* group = nullptr,
                                   int64_t dcp_size = 1, int64_t dcp_interleave = 0,
                                   KvDtype kv_dtype = KvDtype::kF32);

// With DCP (the model's dcp().size > 1) the scheduler's block tables hold group-wide block ids
// (runtime/kv_cache/dcp_blocks.h); the runner keeps this shard's blocks as local ids, writes only
// the tokens its shard holds and gives the attention local sequence lengths.
class ModelRunner : public ModelExecutor {
 public:
  // `kv_pool`: memory for the KV pool (layout.TotalElems() floats, or for kv_dtype kFp8E4m3 an
  // FP8 pool of num_blocks * KvBlockBytes bytes; owned by the caller and outliving the
  // runner, e.g. a transfer agent's shareable allocation), or null: the runner allocates it.
  // Either way it is zero-filled once here. `thread_pool` (nullable) is the pool the model
  // computes on; the runner keeps it alive.
  ModelRunner(std::unique_ptr<CpuModel> model, kernels::KvCacheLayout layout,
              float* kv_pool = nullptr, std::unique_ptr<kernels::ThreadPool> thread_pool = nullptr,
              KvDtype kv_dtype = KvDtype::kF32);

  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override;

  const kernels::KvCacheLayout& layout() const { return layout_; }
  const CpuModel& model() const { return *model_; }
  // The model's per-expert token counts (MoE models; nothing else is counted on the CPU).
  ExecutorStats stats() const override {
    ExecutorStats s;
    s.moe_expert_tokens = model_->ExpertTokens();
    return s;
  }
  // The KV pool memory (block-major, layout()), for registering with a transfer agent.
  void* kv_pool_data() override { return kv_pool_; }
  int64_t kv_pool_bytes() const override { return PoolBytes(layout_, kv_dtype_); }
  // Bytes of a pool of `layout` in `kv_dtype` (kF32, an FP8 latent pool, or FP8 K / V codes).
  static int64_t PoolBytes(const kernels::KvCacheLayout& layout, KvDtype kv_dtype);

 private:
  std::unique_ptr<kernels::ThreadPool> thread_pool_;  // outlives model_ (declared first)
  std::unique_ptr<CpuModel> model_;
  const kernels::KvCacheLayout layout_;
  const KvDtype kv_dtype_;
  std::vector<float> owned_pool_;  // used when no external pool was given
  float* kv_pool_;                 // [layout_.TotalElems()], allocated once
  // Per-step metadata, reused across steps.
  std::vector<int32_t> token_ids_, query_start_loc_, seq_lens_, block_tables_;
  std::vector<int64_t> positions_, slot_mapping_, logit_rows_;
  std::vector<float> logits_;
  // DCP: this shard's part of each scheduled request's block table (local ids), and lengths.
  std::vector<std::vector<BlockId>> local_tables_;
  std::vector<int32_t> local_seq_lens_;

  void BuildDcpTables(const SchedulerOutput& batch);
  // Run()'s per-step metadata (token_ids_ ... local_seq_lens_, logit_rows_) for `batch`; fills
  // (*logit_row_of_seq)[s] with sequence s's first logits row (stays -1 when it samples
  // nothing) and returns the block tables' row width (max_blocks_per_seq).
  int64_t BuildStepMetadata(const SchedulerOutput& batch, std::vector<int64_t>* logit_row_of_seq);
  // Run()'s sampling from logits_: sampled tokens, draft samples, verify and prompt logits.
  void SampleFromLogits(const SchedulerOutput& batch, absl::Span<const int64_t> logit_row_of_seq,
                        RunnerOutput* out) const;
  // The MTP layer's step: `batch.input_hidden` with its zero rows (ScheduledSeq::
  // zero_hidden_rows) filled in, into `rows`; `rows` stays empty when it has none.
  absl::Status ExpandInputHidden(const SchedulerOutput& batch, std::vector<float>* rows) const;
  // return_last_hidden_only: out->hidden_states cut to each sequence's last fed token's row.
  void KeepLastHidden(const SchedulerOutput& batch, RunnerOutput* out) const;
  // Sequence s's block table as this rank's pool sees it.
  absl::Span<const BlockId> Table(const SchedulerOutput& batch, int64_t s) const;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_MODEL_RUNNER_H_
