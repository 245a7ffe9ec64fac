// Merges partial attention results computed over disjoint key sets, weighting each by its
// log-sum-exp: two of them (split-KV decode, chunked prefill) or N (decode context parallelism:
// one partial per KV shard, as the all-to-all of dcp_exchange.h delivers them).
//
// Thread safety: pure function of its inputs; writes only out and lse.
#ifndef TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_
#define TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_

#include <cstdint>

namespace tandem::kernels {

// A read-only view of N partial results for the same [num_tokens, num_heads] rows. Partial i's
// out is out + i * out_stride ([num_tokens, num_heads, head_dim], rows contiguous) and its lse is
// lse + i * lse_stride ([num_tokens, num_heads], fp32 natural log). Strides are in elements, so
// one view serves a dense stack [N][num_tokens, num_heads, head_dim] (out_stride = num_tokens *
// num_heads * head_dim) and the regions of a DCP receive buffer (DcpReceivedPartials).
// T: float on the CPU; float, __nv_bfloat16 or __half for the CUDA twin.
template <typename T>
struct AttnPartials {
  const T* out = nullptr;
  int64_t out_stride = 0;
  const float* lse = nullptr;
  int64_t lse_stride = 0;
  int64_t num_parts = 0;
};

}  // namespace tandem::kernels

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

// N-way merge, for each (token, head) row in fp32 over the non-empty partials E (lse finite):
//   m = max_{i in E} lse_i; w_i = exp(lse_i - m);
//   out = sum_i w_i * out_i / sum_i w_i; lse = m + log(sum_i w_i)
// An lse of NaN or +-inf marks an empty partial (a shard with no visible key yet), whose out is
// never read. Exactly one non-empty partial is copied exactly; none gives out = 0, lse = -inf.
// Partials are summed in index order, so the result does not depend on anything but the inputs.
// out: [num_tokens, num_heads, head_dim]; lse: [num_tokens, num_heads] or null (not wanted).
// out and lse must not overlap the partials. num_parts >= 0 (0: every row empty); pointers may
// be null only when num_tokens * num_heads == 0.
void MergeAttnStatesN(const AttnPartials<float>& parts, int64_t num_tokens, int64_t num_heads,
                      int64_t head_dim, float* out, float* lse);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_ATTENTION_MERGE_ATTN_STATES_H_
