// Merges two partial attention results computed over disjoint key sets, weighting each by its
// log-sum-exp (split-KV decode, chunked prefill, decode context parallelism).
//
// Thread safety: pure function of its inputs; writes only out and lse.
#ifndef TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_
#define TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_

#include <cstdint>

namespace tandem::kernels::cpu {

// For each (token, head), in fp32:
//   m = max(lse_a, lse_b); w_a = exp(lse_a - m); w_b = exp(lse_b - m);
//   out = (w_a * out_a + w_b * out_b) / (w_a + w_b); lse = m + log(w_a + w_b)
// NaN- and inf-safe: an lse of NaN or +inf is treated as -inf (an empty partial), and an empty
// side's out is never read, so its contents do not matter. One side empty -> the other side is
// copied exactly; both empty -> out = 0, lse = -inf.
//
// out_a, out_b, out: [num_tokens, num_heads, head_dim]; lse_a, lse_b, lse: [num_tokens, num_heads].
// out may alias out_a or out_b and lse may alias lse_a or lse_b (exactly, not partially
// overlapping). Pointers may be null only when num_tokens * num_heads == 0.
void MergeAttnStates(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                     int64_t num_tokens, int64_t num_heads, int64_t head_dim, float* out,
                     float* lse);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_
