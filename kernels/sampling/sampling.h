// Token sampling from one row of logits: greedy, or temperature + top-k + top-p with a
// counter-based RNG, so a request's token at a given output index is reproducible regardless of
// batching, preemption or which worker produced it.
//
// Stateless; safe to call concurrently.
#ifndef TANDEM_KERNELS_SAMPLING_SAMPLING_H_
#define TANDEM_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off; must be in (0, 1]
  uint64_t seed = 0;
  // > 0: only ids < vocab_limit can be picked, as if the row ended there (the logits past it are
  // masked: a model's embedding padded past its tokenizer has rows no tokenizer can decode).
  // 0, or >= the row's vocab: the whole row.
  int64_t vocab_limit = 0;
};

// The ids a row of `vocab` logits is sampled from: [0, SampledVocab(vocab, params)).
inline int64_t SampledVocab(int64_t vocab, const SamplingParams& p) {
  return p.vocab_limit > 0 && p.vocab_limit < vocab ? p.vocab_limit : vocab;
}

// INVALID_ARGUMENT when temperature is negative or not finite, top_k < 0, top_p is not in
// (0, 1] (NaN included), or vocab_limit < 0, naming the field and value.
absl::Status ValidateSamplingParams(const SamplingParams& p);

// The uniform draw in [0, 1) used for the token at output index `step` of a request seeded
// with `seed`: Philox4x32-10 with key = seed and counter = {step low, step high, 0, 0}, first
// two output words as 53 bits. Exposed so other backends (CUDA) draw the same number.
double SamplingUniform(uint64_t seed, uint64_t step);
// An independent draw for the same (seed, step) on another stream: counter word 2 = `stream`
// (stream 0 is SamplingUniform). Speculative decoding draws its draft tokens, acceptance tests
// and residual samples from streams 1-3, away from the token samples.
double SamplingUniform(uint64_t seed, uint64_t step, uint32_t stream);

namespace cpu {

// Picks one token id from logits: [vocab] (vocab >= 1), among the first
// SampledVocab(vocab, params) only: the result equals SampleToken of the row cut there with no
// vocab_limit, so an id >= params.vocab_limit (> 0) is never returned.
// REQUIRES: ValidateSamplingParams(params).ok().
//
// Greedy (temperature == 0): argmax; the lowest index wins ties; NaN never wins.
// Otherwise, in this order (as transformers' logits processors do):
//   1. temperature: probabilities proportional to exp((logit - max) / temperature);
//   2. top_k > 0: keep the k largest logits (exactly k: ties at the boundary go to the lower
//      index, so top_k == 1 is greedy; transformers would keep every tied token);
//   3. top_p < 1: keep the smallest set of most probable remaining tokens whose probability,
//      renormalized over the remaining ones, sums to >= top_p (at least one token; ties in
//      probability again go to the lower index);
//   4. renormalize over the kept tokens and pick by inverse CDF, scanning kept tokens in index
//      order, with u = SamplingUniform(params.seed, step).
// NaN and -inf logits have probability 0. +inf logits share all the probability equally. If
// no logit is finite or +inf (all NaN / -inf), the result is the greedy choice (0 if all NaN).
int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& params,
                    uint64_t step);

// The distribution SampleToken draws from: probs[v] for v in [0, vocab), zero outside the kept
// tokens (steps 1-3 above) and past vocab_limit, summing to 1. Greedy (temperature 0, or a row
// of one id) is one-hot at the greedy choice. REQUIRES: ValidateSamplingParams(params).ok().
void TokenProbabilities(const float* logits, int64_t vocab, const SamplingParams& params,
                        double* probs);

// Inverse CDF over probs[0, vocab) in index order with u in [0, 1): the first id whose cumulative
// weight exceeds u * total (weights need not be normalized; ids of weight <= 0 are never picked;
// the last positive one if rounding runs past the end; 0 if none is positive).
int32_t SampleFromWeights(const double* weights, int64_t vocab, double u);

}  // namespace cpu
}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_SAMPLING_SAMPLING_H_
