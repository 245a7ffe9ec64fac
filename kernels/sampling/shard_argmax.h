// Greedy sampling over vocab-parallel logits without gathering them (issue 31 item 3): each
// tensor-parallel rank holds the logits of its vocabulary rows [first_id, first_id + cols); it
// reduces a row to its best candidate (value, id), the ranks exchange those 8-byte candidates,
// and every rank picks the same token. The result is exactly the greedy choice of the whole row
// (cpu::SampleToken / cuda::SampleTokens with temperature 0, or top_k 1): the argmax among the
// first SampledVocab ids, NaN never wins, the lowest id wins ties (-inf is a value like any
// other), 0 when every logit is NaN. That order is total on the candidates, so the per-rank
// reduction and the pick may combine them in any grouping.
//
// Header-only; host and device (the CUDA kernels are kernels/sampling/cuda/shard_argmax_cuda.h).
#ifndef TANDEM_KERNELS_SAMPLING_SHARD_ARGMAX_H_
#define TANDEM_KERNELS_SAMPLING_SHARD_ARGMAX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_SHARD_HD __host__ __device__
#else
#define TANDEM_SHARD_HD
#endif

namespace tandem::kernels {

// A rank's best logit of a row and its vocabulary id; id < 0: no candidate (no id of the rank's
// rows is sampled, or all of them are NaN).
struct ShardCandidate {
  float value;
  int32_t id;
};
static_assert(sizeof(ShardCandidate) == 8, "exchanged as two 4-byte words");

// True when `a` is the better greedy choice: a real candidate with a larger value, or the same
// value and a lower id. NaN values are never candidates (callers skip them).
TANDEM_SHARD_HD inline bool Beats(const ShardCandidate& a, const ShardCandidate& b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// The ids of a row that take part: [0, limit) with limit = vocab_limit when 0 < vocab_limit <
// vocab, else vocab (SampledVocab).
TANDEM_SHARD_HD inline int64_t ShardSampledLimit(int64_t vocab, int64_t vocab_limit) {
  return vocab_limit > 0 && vocab_limit < vocab ? vocab_limit : vocab;
}

// The host reduction of one rank's row: logits[c] is id first_id + c for c in [0, cols); ids at
// or past `limit` (padding rows, vocab_limit) are skipped.
inline ShardCandidate ShardArgmax(const float* logits, int64_t cols, int64_t first_id,
                                  int64_t limit) {
  ShardCandidate best{0.0f, -1};
  for (int64_t c = 0; c < cols && first_id + c < limit; ++c) {
    if (logits[c] != logits[c]) continue;  // NaN
    const ShardCandidate mine{logits[c], static_cast<int32_t>(first_id + c)};
    if (Beats(mine, best)) best = mine;
  }
  return best;
}

// The token from every rank's candidate (any order): the best, or 0 when there is none.
TANDEM_SHARD_HD inline int32_t PickShardCandidate(const ShardCandidate* candidates, int n) {
  ShardCandidate best{0.0f, -1};
  for (int i = 0; i < n; ++i) {
    if (Beats(candidates[i], best)) best = candidates[i];
  }
  return best.id < 0 ? 0 : best.id;
}

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_SAMPLING_SHARD_ARGMAX_H_
