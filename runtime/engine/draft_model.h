// The draft-model drafter of speculative decoding (SpeculativeMethod::kDraft): a smaller model of
// the target's vocabulary, on an executor of its own (the same backend kind) with its own paged
// KV cache, proposes k tokens per request per verify step.
//
// For every request that speculates this step with k drafts, Propose:
//   1. catches the draft model up on the request's tokens it has not processed (the whole prompt
//      the first time, a P -> D request's too; then the tokens accepted since), in chunks of at
//      most max_num_batched_tokens, without sampling;
//   2. runs k one-token steps for all such requests together: step 0 feeds the request's last
//      token, step j its draft d_j; each samples d_{j+1} with the request's sampling parameters
//      (greedy: the argmax; otherwise q = cpu::TokenProbabilities of the draft's logits, and d
//      drawn from q with SamplingUniform(seed, output index, stream 1)), keeping q for the
//      verifier's rejection sampling (RejectionSampleDrafts).
// The draft KV of every fed token stays in the draft cache; the next call keeps the longest common
// prefix of the tokens fed and the request's tokens now (a rejected draft's slot is simply
// rewritten), so the cache follows the accepted tokens without a rollback call.
//
// A request whose draft blocks cannot be allocated gets no drafts this step (it decodes plainly).
// Free() drops a request's draft blocks (the engine calls it when the request finishes or is
// aborted; a preempted request keeps them: its tokens do not change).
//
// Thread safety: not thread-safe; the engine's step loop owns it.
#ifndef TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_H_
#define TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/sampling.h"
#include "runtime/engine/model_executor.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

// The draft executor's bounds (the target engine's, so the draft serves whatever it admits).
struct DraftModelOptions {
  int64_t num_blocks = 0;  // the draft cache's blocks (the target pool's count)
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 2048;  // tokens per catch-up step
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 4096;
};

// What a proposer with its own model runs on, sized by `options` (the draft-model and MTP
// proposers' Create): its own KV pool, without prefix caching (per-request tables, nothing
// shared), and its executor's spec for `config`.
absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateProposerKvCache(
    const DraftModelOptions& options);
ExecutorSpec ProposerExecutorSpec(const ModelConfig& config, const DraftModelOptions& options);

// One request's drafting job for this step.
struct DraftJob {
  int64_t request_id = 0;
  absl::Span<const int32_t> tokens;  // prompt + output; the verify pass feeds tokens.back()
  int64_t num_drafts = 0;            // k >= 1
  kernels::SamplingParams sampling;
  int64_t sample_step = 0;  // output index of the token after tokens.back()
  // Filled by Propose: k drafts, or none (no room in the draft cache).
  std::vector<int32_t> drafts;
  // [k][vocab] the draft distributions the drafts were drawn from (sampling requests only).
  std::vector<double> probs;
};

class DraftModelProposer {
 public:
  // INVALID_ARGUMENT when the draft's vocabulary differs from the target's (naming both sizes)
  // or its max_position_embeddings is below options.max_model_len; the backend's errors.
  static absl::StatusOr<std::unique_ptr<DraftModelProposer>> Create(
      const ExecutorFactory& backend, const ModelConfig& target, const ModelConfig& draft,
      ModelWeights weights, const DraftModelOptions& options);

  // Fills every job's drafts (and probs). REQUIRES: distinct request ids; tokens.size() >= 1 and
  // tokens.size() - 1 + num_drafts <= max_model_len.
  absl::Status Propose(absl::Span<DraftJob> jobs);
  // Drops the request's draft blocks and state; no-op for an unknown id.
  void Free(int64_t request_id);

  int64_t num_free_blocks() const { return kv_cache_->Stats().num_free_blocks; }
  int64_t num_blocks() const { return kv_cache_->num_blocks(); }
  const ModelConfig& config() const { return config_; }

 private:
  DraftModelProposer(const ModelConfig& config, const DraftModelOptions& options,
                     std::unique_ptr<KvCacheManager> kv_cache,
                     std::unique_ptr<ModelExecutor> executor);

  // Runs the catch-up steps: every active job's tokens before its last one, chunked.
  absl::Status CatchUp(absl::Span<DraftJob* const> active);
  // Draft step `round` (0-based) for the jobs with more than `round` drafts.
  absl::Status DraftRound(absl::Span<DraftJob* const> active, int64_t round);

  const ModelConfig config_;
  const DraftModelOptions options_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  std::unique_ptr<ModelExecutor> executor_;
  // Per request: the tokens whose draft KV is in the cache, in position order.
  absl::flat_hash_map<int64_t, std::vector<int32_t>> fed_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_H_
