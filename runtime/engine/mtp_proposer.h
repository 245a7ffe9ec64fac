// The MTP drafter of speculative decoding (SpeculativeMethod::kMtp): DeepSeek-V3's multi-token
// prediction layer (runtime/model/mtp_weights.h; on the CPU runtime/cpu/mtp_model.h) on an
// executor of its own with its own latent KV cache (one layer), fed the target model's hidden
// states.
//
// The MTP run at position i pairs the token at i + 1 with the target's final hidden state of
// position i and predicts the token at i + 2. So:
//   * after every target step the engine hands over the hidden states of the tokens it fed
//     (RecordHidden; RunnerOutput::hidden_states, asked for with
//     SchedulerOutput::return_hidden_states only while MTP is on), for the requests that may draft
//     in the next step (ScheduledSeq::may_draft_next): none while a request's adaptive draft
//     length pauses it (so a step in which nobody may draft next reads nothing back), except in
//     the step before its probe. A verify pass's rows past the accepted tokens are simply
//     overwritten by the next step that feeds those positions.
//   * Propose, for a request of tokens t_0 .. t_{L-1} (the verify pass will feed t_{L-1} and the
//     drafts): catches the MTP's KV up on positions valid .. L - 2 (pairs (t_{i+1}, h_i); the whole
//     prompt the first time) in chunks of at most max_num_batched_tokens; position L - 2's logits
//     give the first draft d_1. Draft j + 1 then comes from the MTP layer chained on its own
//     output: position L - 2 + j fed d_j with the MTP's own hidden state of the position before
//     (vLLM's single-layer chaining). Drafts are sampled as the draft model samples them (greedy:
//     argmax; else q from the logits and SamplingUniform stream 1), q kept for the verifier's
//     rejection sampling. The chained positions' KV is rewritten by the next catch-up, whose
//     inputs are the target's hidden states: `valid` never counts them.
// Positions whose target hidden state this process never computed or never asked for (a
// prefix-cache hit; a P -> D request's prompt without a handoff; steps of an adaptive pause)
// enter the MTP's KV with a zero hidden state (the token's embedding alone; the executor fills the
// leading ones of a catch-up, ScheduledSeq::zero_hidden_rows, so they are neither built nor
// uploaded). The MTP's steps return one hidden row per sequence (return_last_hidden_only), the
// rows chained drafts need. Drafts stay exactly verified; only acceptance can drop.
//
// P -> D (MtpHandoff, request.h): a prefill worker with the MTP layer attached (it never drafts)
// runs it over the prompt once the prefill completes (ExportPrompt: positions 0 .. L - 2, the
// catch-up a mixed worker runs) and hands its latent rows and h_{L-1} to the decode worker,
// which writes them into its own MTP cache (ImportPrompt): its first Propose then runs exactly
// what a mixed worker's runs (position L - 1 with (t_L, h_{L-1}), then the chain). CPU pools
// only (the rows are read and written on the host); a handoff of more than kMaxHandoffBytes of
// rows is not made (the decode worker then uses zeros, as without one).
//
// Memory: a request holding kMaxHeldRows hidden-state rows or more after a step (a long prompt's
// chunks, decode steps without drafts) has the MTP's KV caught up at once (BoundHeld): fewer than
// kMaxHeldRows rows per request stay between steps, not the whole prompt until the first draft.
// A request whose MTP blocks cannot be allocated gets no drafts this step (it decodes plainly).
// Thread safety: not thread-safe; the engine's step loop owns it.
#ifndef TANDEM_RUNTIME_ENGINE_MTP_PROPOSER_H_
#define TANDEM_RUNTIME_ENGINE_MTP_PROPOSER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/model_executor.h"
#include "runtime/engine/request.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {

// Builds the MTP layer's executor for the target config spec.model_config (the CPU backend's:
// CpuMtpExecutorFactory). The executor must honour SchedulerOutput::input_hidden and
// return_hidden_states (the MTP layer's output before shared_head.norm).
// What a target step fed one request, for MtpProposer::BoundHeld: the request's tokens (prompt and
// accepted output; no drafts) and the end of the positions the step fed with them (a verify
// pass's first position + 1; a prefill chunk's or plain decode step's last + 1).
struct MtpFedTokens {
  int64_t request_id = 0;
  absl::Span<const int32_t> tokens;
  int64_t fed_end = 0;
};

using MtpExecutorFactory = std::function<absl::StatusOr<std::unique_ptr<ModelExecutor>>(
    const ExecutorSpec& spec, MtpWeights weights)>;
MtpExecutorFactory CpuMtpExecutorFactory(int num_threads);

class MtpProposer {
 public:
  // INVALID_ARGUMENT when the target is not a DeepSeek MLA model; the factory's errors.
  static absl::StatusOr<std::unique_ptr<MtpProposer>> Create(const MtpExecutorFactory& backend,
                                                             const ModelConfig& target,
                                                             MtpWeights weights,
                                                             const DraftModelOptions& options);

  // The target's final hidden states of the tokens a step fed for `request_id`, at positions
  // first_position .. (rows: [n, hidden]); replaces what was recorded at those positions and after.
  void RecordHidden(int64_t request_id, int64_t first_position, absl::Span<const float> rows);
  // Bounds the hidden states held per request (a long prompt's prefill chunks, decode steps
  // without drafts): a request holding kMaxHeldRows rows or more has its MTP KV caught up now on
  // the positions whose next token is its own (positions < min(fed_end, tokens.size() - 1)), and
  // those rows dropped. Without MTP blocks for them the rows are dropped anyway (those positions
  // then enter with zeros: exact, acceptance may drop). Call after RecordHidden.
  absl::Status BoundHeld(absl::Span<const MtpFedTokens> fed);
  static constexpr int64_t kMaxHeldRows = 64;

  // Fills every job's drafts (and probs for sampling requests), as DraftModelProposer::Propose.
  // REQUIRES: distinct request ids; tokens.size() >= 2 (a prompt token and an output token).
  absl::Status Propose(absl::Span<DraftJob> jobs);
  // Drops the request's MTP blocks and hidden states; no-op for an unknown id.
  void Free(int64_t request_id);

  // P side, after RecordHidden of the step that completed the prompt `prompt` (L tokens): the
  // catch-up of MTP positions 0 .. L - 2 (as Propose would run it); no-op without MTP blocks.
  absl::Status CatchUpPrompt(int64_t request_id, absl::Span<const int32_t> prompt);
  // P side, once that request finished holding its KV (before Free): the latent rows of
  // positions 0 .. num_tokens - 2 and the held h_{num_tokens - 1}. nullopt when no handoff can be
  // made (not caught up, h not held, a device pool, more than kMaxHandoffBytes of rows).
  std::optional<MtpHandoff> ExportPrompt(int64_t request_id, int64_t num_tokens);
  // D side: INVALID_ARGUMENT, naming both, when `handoff` was made by an MTP layer of another
  // latent or hidden width (a prefill worker with another model); OK otherwise.
  absl::Status ValidateHandoff(const MtpHandoff& handoff) const;
  // D side, for a new request (REQUIRES: ValidateHandoff OK): its MTP KV of positions
  // 0 .. num_positions - 1 from the handoff, and h at num_positions. Without MTP blocks for them
  // (or on a device pool) nothing is taken: the prompt then enters with zeros (exact).
  void ImportPrompt(int64_t request_id, const MtpHandoff& handoff);
  static constexpr int64_t kMaxHandoffBytes = int64_t{4} << 20;
  // Handoffs ExportPrompt made plus those ImportPrompt took (a worker's stats).
  uint64_t num_handoffs() const { return num_handoffs_; }
  // Floats of one latent row (kv_lora_rank + qk_rope_head_dim).
  int64_t row_width() const { return target_.kv_lora_rank + target_.qk_rope_head_dim; }

  int64_t num_free_blocks() const { return kv_cache_->Stats().num_free_blocks; }
  int64_t num_blocks() const { return kv_cache_->num_blocks(); }
  // Hidden-state rows held for a request (for tests: below kMaxHeldRows + a step's rows).
  int64_t held_hidden_rows(int64_t request_id) const;

 private:
  struct RequestState {
    int64_t hidden_begin = 0;   // position of hidden's first row
    std::vector<float> hidden;  // [rows, hidden] target hidden states from hidden_begin on
    int64_t valid = 0;          // MTP KV of positions [0, valid) made from target hidden states
  };

  MtpProposer(const ModelConfig& target, const DraftModelOptions& options,
              std::unique_ptr<KvCacheManager> kv_cache, std::unique_ptr<ModelExecutor> executor);

  // One request's catch-up: MTP positions valid .. end - 1; `draft` (null: none) samples its
  // first draft at position end - 1.
  struct CatchUpJob {
    int64_t request_id = 0;
    absl::Span<const int32_t> tokens;
    int64_t end = 0;
    DraftJob* draft = nullptr;
  };
  // The catch-up steps, chunked by max_num_batched_tokens.
  absl::Status CatchUp(absl::Span<const CatchUpJob> jobs);
  // Chained draft `round` (>= 1) for the jobs with more than `round` drafts.
  absl::Status ChainRound(absl::Span<DraftJob* const> active, int64_t round);
  // Appends the target hidden state of `position` (zeros where none was recorded) to `out`.
  void AppendHidden(const RequestState& state, int64_t position, std::vector<float>* out) const;
  // The host address of the MTP's latent row of `position` (its blocks allocated); null on a
  // device pool or a pool of another size than f32 rows of row_width().
  float* LatentRow(int64_t request_id, int64_t position);
  // INTERNAL unless a step that asked for hidden states got one row per sequence
  // (SchedulerOutput::return_last_hidden_only).
  absl::Status CheckLastHidden(const SchedulerOutput& step, const RunnerOutput& out) const;
  // Turns sequence s of `out` (which sampled) into job's next draft.
  absl::Status TakeDraft(const RunnerOutput& out, size_t s, const ScheduledSeq& seq,
                         DraftJob* job) const;

  const ModelConfig target_;
  const DraftModelOptions options_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  std::unique_ptr<ModelExecutor> executor_;
  absl::flat_hash_map<int64_t, RequestState> state_;
  uint64_t num_handoffs_ = 0;
  // This Propose's chained hidden state per request ([hidden]: the MTP's output of its last run).
  absl::flat_hash_map<int64_t, std::vector<float>> chain_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_MTP_PROPOSER_H_
