// Speculative decoding, drafter and verifier halves that the scheduler calls (no model here).
//
// Drafting (n-gram prompt lookup): the request's tokens (prompt + output) end in an n-gram that
// occurred earlier; the tokens that followed its latest earlier occurrence are the draft. The
// longest n in [ngram_max .. ngram_min] with a match wins.
//
// Verification: the step feeds [last token, d_1 .. d_K] and the executor samples one token x_i at
// every fed position i with the request's own sampler and Philox counter (output index + i), so
// x_i is what decoding without speculation would sample after the prefix ending at position i.
// The accepted run is the longest a with x_i == d_{i+1} for every i < a; the request gains
// x_0 .. x_a (a drafts plus one correction or, when all K are accepted, one bonus token).
//
// Why this is exact: for a point-mass draft (an n-gram draft has q(d) = 1), Leviathan et al.'s
// rule accepts d with probability min(1, p(d) / q(d)) = p(d) and, on rejection, samples from
// norm(max(0, p - q)) = p with d removed and renormalised. Drawing x ~ p and accepting iff x == d
// does exactly that: P(accept) = P(x == d) = p(d), and given x != d, x is distributed as p
// restricted to the other tokens, renormalised. Greedy (temperature 0) is the argmax at every
// position, so the output is token-for-token the non-speculative one; with a seed, sampling
// reproduces the non-speculative tokens of the same seed too (same counter per output index).
//
// Thread safety: the functions are pure; SpecStats is a plain value.
#ifndef TANDEM_RUNTIME_ENGINE_SPECULATIVE_H_
#define TANDEM_RUNTIME_ENGINE_SPECULATIVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::runtime {

enum class SpeculativeMethod {
  kNone,
  kNgram,  // prompt lookup over prompt + output
  kDraft,  // a smaller model of the same vocabulary (draft_model.h), K steps per verify
  kMtp,    // DeepSeek-V3's multi-token prediction layer (mtp_proposer.h), chained K times
};

// Benchmarks and tests only (runtime/engine/spec_oracle.h; no flag or worker option sets one):
// replaces a request's drafts so that the verifier can be measured at a chosen acceptance.
// Called on the engine's scheduling thread; must outlive the engine.
class BenchDraftHook {
 public:
  virtual ~BenchDraftHook() = default;
  // Caps the drafts of `request_id` this pass, for every method (0: a plain decode step).
  virtual int64_t MaxDrafts(int64_t request_id) const = 0;
  // Method kNgram: the drafts after `tokens` (prompt + output), at most max_tokens, instead of
  // prompt lookup; nullopt: prompt lookup as usual.
  virtual std::optional<std::vector<int32_t>> Draft(int64_t request_id,
                                                    absl::Span<const int32_t> tokens,
                                                    int64_t max_tokens) const = 0;
};

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int64_t num_speculative_tokens = 0;  // K: drafts per request per step (at most)
  int64_t ngram_min = 1;               // shortest suffix n-gram that may match
  int64_t ngram_max = 4;               // longest suffix n-gram tried first
  // Adaptive draft length per request (DraftLengthState below); false: always up to K drafts.
  bool adaptive = true;
  // Longest pause (plain decode steps) between two probes of a request whose drafts keep failing.
  int64_t max_pause_steps = 32;
  // Batch-level: no request drafts in a step that starts with at least this many running
  // requests (0: never disabled). Large batches are compute-bound, where drafts stop paying.
  int64_t disable_by_batch_size = 0;
  // Benchmarks and tests only (BenchDraftHook); null in serving.
  const BenchDraftHook* bench_hook = nullptr;
  bool enabled() const { return method != SpeculativeMethod::kNone && num_speculative_tokens > 0; }
};

// "none" (or "") / "ngram" / "draft" / "mtp"; INVALID_ARGUMENT otherwise.
absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(absl::string_view name);
const char* SpeculativeMethodName(SpeculativeMethod method);
// K in [1, 16] when a method is set, 1 <= ngram_min <= ngram_max <= 64.
absl::Status ValidateSpeculativeConfig(const SpeculativeConfig& config);

// Up to `max_tokens` draft tokens continuing `tokens` (prompt + output) by prompt lookup: for n
// from ngram_max down to ngram_min, the latest earlier occurrence of tokens' last n tokens; the
// tokens that followed it (at most max_tokens, never past the end). Empty: no match.
std::vector<int32_t> NgramDraft(absl::Span<const int32_t> tokens, const SpeculativeConfig& config,
                                int64_t max_tokens);

// The accepted run: the number of leading drafts equal to the target's samples at the positions
// before them. target_samples[i] was sampled after the prefix ending with fed token i (0 = the
// request's last token, i >= 1 = drafts[i - 1]). REQUIRES: target_samples.size() >= drafts.size().
int64_t AcceptedDraftLength(absl::Span<const int32_t> drafts,
                            absl::Span<const int32_t> target_samples);

// Adaptive draft length of one request (vLLM / SGLang-style back-off), so that a request whose
// drafts keep being rejected stops paying for them. A verify pass costs more than a plain step
// (on the CPU, where a step is bound by the weight GEMMs, 4 fed tokens cost ~2 plain steps;
// runtime/engine/BENCHMARKS.md), so drafts that are rarely accepted make decoding slower.
//   * The first pass drafts up to K.
//   * Every draft accepted: the next pass may draft one more (up to K); the pause resets to 1.
//   * Some accepted: unchanged (the pause resets to 1).
//   * None accepted: the draft length halves; from 1 it goes to 0, which pauses speculation for
//     `pause` plain decode steps, then probes with 1 draft; each failed probe doubles the pause
//     (up to max_pause_steps), an accepted one grows the length again.
// At acceptance 0 and K = 3 a request verifies 3 + 1 drafts, then one draft after pauses of 1,
// 2, 4, ... 32 steps: about 1 draft per 32 tokens in the long run.
// Exactness does not depend on it: the draft length only decides how many tokens are verified.
struct DraftLengthState {
  int64_t draft_len = -1;  // drafts the next pass may propose; -1: not started (K)
  int64_t paused = 0;      // plain decode steps left before the next probe
  int64_t pause = 1;       // the pause after the next pass that accepts nothing at length 1
};

// The drafts `state`'s request may propose at this decode step (0: decode plainly; a paused
// step is counted here). Always K when !config.adaptive.
int64_t NextDraftLength(const SpeculativeConfig& config, DraftLengthState* state);
// After a verify pass that proposed `drafted` (>= 1) drafts and accepted `accepted` of them.
void UpdateDraftLength(const SpeculativeConfig& config, int64_t drafted, int64_t accepted,
                       DraftLengthState* state);

// Drafts sampled from a draft distribution q (a draft model, MTP) are verified by Leviathan et
// al.'s rejection sampling: kernels/sampling/rejection.h (CPU) and its device twin
// kernels/sampling/cuda/rejection_cuda.h (the CUDA runner).

// Counters of one engine (or worker): verify passes, drafted tokens, accepted tokens.
struct SpecStats {
  uint64_t verify_passes = 0;    // (request, step) pairs that verified >= 1 draft
  uint64_t drafted_tokens = 0;   // drafts fed to the model
  uint64_t accepted_tokens = 0;  // drafts accepted (before any stop cut the run)
  // accepted / drafted (0 with no drafts).
  double acceptance_rate() const;
  // Tokens a verify pass yields on average: 1 + accepted / passes (the correction or bonus token
  // plus the accepted drafts); 0 with no passes.
  double mean_accepted_length() const;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_SPECULATIVE_H_
