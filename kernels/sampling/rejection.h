// Leviathan et al.'s rejection sampling of speculative drafts ("Fast Inference from Transformers
// via Speculative Decoding", ICML 2023), the CPU reference; kernels/sampling/cuda/rejection_cuda.h
// is its device twin (the same uniforms, the same scan order).
//
// Drafts d_1 .. d_k were drawn from draft distributions q_1 .. q_k; the target's distributions
// at the same positions are p_1 .. p_{k+1}. Draft d_i is accepted with probability
// min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from the residual
// norm(max(0, p_i - q_i)) and the rest is dropped; when all k are accepted a bonus token is drawn
// from p_{k+1}. The emitted tokens are distributed as sampling from p alone, position by position.
//
// Uniforms come from the request's seed (SamplingUniform, kernels/sampling/sampling.h): the test
// of draft i (0-based) from (seed, first_step + i, stream kAcceptStream), the residual or bonus
// sample at position a from (seed, first_step + a, stream kResidualStream). Stream 0 is the
// target's own samples and stream 1 the draft tokens, so a seeded request reproduces.
//
// Stateless; safe to call concurrently.
#ifndef TANDEM_KERNELS_SAMPLING_REJECTION_H_
#define TANDEM_KERNELS_SAMPLING_REJECTION_H_

#include <cstdint>

#include "absl/types/span.h"

namespace tandem::kernels {

inline constexpr uint32_t kDraftStream = 1;
inline constexpr uint32_t kAcceptStream = 2;
inline constexpr uint32_t kResidualStream = 3;

struct RejectionOutcome {
  int64_t accepted = 0;    // leading drafts accepted
  int32_t next_token = 0;  // the residual sample at the first rejection, or the bonus token
};

namespace cpu {

// target_probs: [k + 1][vocab] (p_1 .. p_{k+1}); draft_probs: [k][vocab]; drafts: [k] (k >= 0).
// Acceptance: u * q(d) < p(d). The residual is max(0, p - q) with d's entry zeroed (p(d) < q(d)
// there anyway); if rounding leaves it no mass, p with d zeroed. The pick is SampleFromWeights
// (inverse CDF in index order).
RejectionOutcome RejectionSampleDrafts(absl::Span<const double> target_probs,
                                       absl::Span<const double> draft_probs,
                                       absl::Span<const int32_t> drafts, int64_t vocab,
                                       uint64_t seed, uint64_t first_step);

}  // namespace cpu
}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_SAMPLING_REJECTION_H_
