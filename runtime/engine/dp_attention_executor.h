// Data-parallel attention's executor (`--tp=N --enable_expert_parallel --dp_attention`;
// runtime/model/tensor_parallel.h, "Wide expert parallelism"; dp_rank.h for the placement).
//
// Every rank of the group gets the whole step (rank 0's plan lists every DP rank's sequences,
// ScheduledSeq::dp_rank) and:
//   1. runs ITS sequences only (the batch of its DP rank; empty when it has none, so that the
//      model still joins every MoE layer's all-to-alls), their block ids mapped to its own pool
//      (block id x lives on DP rank x % N at local block x / N, KvCacheConfig::dp_size), with
//      SchedulerOutput::dp_decode_seqs = the most sequences a DP rank runs when every DP rank
//      decodes, else 0 (so that the CUDA runner pads every rank alike and replays graphs);
//   2. shares its results with one AllReduceSum: each sequence's sampled token and captured
//      prompt logits (filled by the owner, zeros elsewhere) and this step's per-expert token
//      counts, so that every rank returns the whole step's RunnerOutput and the group's counts.
// The wrapped executor (the CPU ModelRunner or the CUDA runner over a model whose config has
// dp_attention; an empty batch still runs the MoE layers' collectives) never
// sees another rank's sequences. Speculative decoding is refused (verifies_drafts false).
//
// Thread safety: as ModelExecutor (the engine's step loop only; health() thread-safe).
#ifndef TANDEM_RUNTIME_ENGINE_DP_ATTENTION_EXECUTOR_H_
#define TANDEM_RUNTIME_ENGINE_DP_ATTENTION_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "runtime/engine/model_executor.h"

namespace tandem::runtime {

// `local` wrapped for data-parallel attention over `group` (size >= 2, outliving the executors):
// ExecutorFactory::dp_size = the group's size, each executor a DpAttentionExecutor around one of
// `local`'s (ExecutorSpec::num_blocks is this rank's pool).
ExecutorFactory DpAttentionExecutorFactory(ExecutorFactory local, comm::ProcessGroup* group);

class DpAttentionExecutor : public ModelExecutor {
 public:
  // `vocab_size`: the width of captured prompt logits; `num_experts`: of the expert counts (0 for
  // a dense model).
  DpAttentionExecutor(std::unique_ptr<ModelExecutor> local, comm::ProcessGroup* group,
                      int64_t vocab_size, int64_t num_experts);

  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override;
  void* kv_pool_data() override { return local_->kv_pool_data(); }
  int64_t kv_pool_bytes() const override { return local_->kv_pool_bytes(); }
  bool pool_on_device() const override { return local_->pool_on_device(); }
  // The local executor's counters, with moe_expert_tokens summed over the group's ranks.
  ExecutorStats stats() const override;
  absl::Status health() const override { return local_->health(); }

  // Sequences of the last step this rank ran (tests).
  int64_t last_local_seqs() const { return last_local_seqs_; }

 private:
  // This rank's sequences of `batch` into mine_ (block ids as local ids); index_ maps them back.
  absl::Status Split(const SchedulerOutput& batch);

  const std::unique_ptr<ModelExecutor> local_;
  comm::ProcessGroup* const group_;
  const int64_t vocab_size_;
  const int64_t num_experts_;
  SchedulerOutput mine_;
  std::vector<int64_t> index_;                // mine_.seqs[i] is batch.seqs[index_[i]]
  std::vector<std::vector<BlockId>> tables_;  // [mine], local ids
  std::vector<float> shared_;                 // the all-reduced results
  std::vector<uint64_t> counted_;             // local expert counts already shared
  std::vector<uint64_t> group_expert_tokens_;
  int64_t last_local_seqs_ = 0;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_DP_ATTENTION_EXECUTOR_H_
