// CUDA twin of kernels/attention/merge_attn_states.h: merges two (split-KV, chunked prefill) or N
// (decode context parallelism) partial attention results over disjoint key sets by their
// log-sum-exp.
//
// Thread safety: asynchronous on `stream`; writes only out and lse.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_MERGE_ATTN_STATES_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_MERGE_ATTN_STATES_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/merge_attn_states.h"

namespace tandem::kernels::cuda {

// For each (token, head), in fp32, exactly the CPU semantics:
//   m = max(lse_a, lse_b); w_a = exp(lse_a - m); w_b = exp(lse_b - m);
//   out = (w_a * out_a + w_b * out_b) / (w_a + w_b); lse = m + log(w_a + w_b)
// An lse of NaN or +-inf marks an empty partial whose out is never read; one side empty copies
// the other exactly; both empty give out = 0, lse = -inf.
// out_*: [num_tokens, num_heads, head_dim] of T (float, __nv_bfloat16 or __half; device);
// lse_*: [num_tokens, num_heads] fp32 (device). out may alias out_a or out_b and lse may alias
// lse_a or lse_b exactly. head_dim * sizeof(T) must be a multiple of 16 and the pointers 16-byte
// aligned (INVALID_ARGUMENT otherwise, or for negative sizes / null pointers). Asynchronous.
template <typename T>
absl::Status MergeAttnStates(const T* out_a, const float* lse_a, const T* out_b, const float* lse_b,
                             int64_t num_tokens, int64_t num_heads, int64_t head_dim, T* out,
                             float* lse, cudaStream_t stream);

extern template absl::Status MergeAttnStates<float>(const float*, const float*, const float*,
                                                    const float*, int64_t, int64_t, int64_t, float*,
                                                    float*, cudaStream_t);
extern template absl::Status MergeAttnStates<__nv_bfloat16>(const __nv_bfloat16*, const float*,
                                                            const __nv_bfloat16*, const float*,
                                                            int64_t, int64_t, int64_t,
                                                            __nv_bfloat16*, float*, cudaStream_t);
extern template absl::Status MergeAttnStates<__half>(const __half*, const float*, const __half*,
                                                     const float*, int64_t, int64_t, int64_t,
                                                     __half*, float*, cudaStream_t);

// N-way merge with exactly cpu::MergeAttnStatesN's semantics, fp32 math, output in T: partials
// summed over the non-empty ones (lse finite): up to 8 partials in index order, a warp per row
// (DCP's ranks; and split-KV's few partials over many rows); more (split-KV's tens to hundreds),
// or long rows of several partials over <= 256 rows, by CTAs per row slice whose thread groups
// sum interleaved partials, the groups then added in order (only the rounding differs). NaN/+-inf
// lse = empty, its out never read; one non-empty partial is copied exactly; none gives out = 0,
// lse = -inf. parts: device view (AttnPartials: a dense stack, or the regions of a DCP receive
// buffer); out: [num_tokens, num_heads, head_dim] of T; lse: [num_tokens, num_heads] fp32 or
// null. out and lse must not overlap the partials. head_dim * sizeof(T), parts.out_stride *
// sizeof(T) and the out pointers must be 16-byte aligned (INVALID_ARGUMENT otherwise, or for
// negative sizes / strides / null pointers when there are rows). Asynchronous.
template <typename T>
absl::Status MergeAttnStatesN(const AttnPartials<T>& parts, int64_t num_tokens, int64_t num_heads,
                              int64_t head_dim, T* out, float* lse, cudaStream_t stream);

extern template absl::Status MergeAttnStatesN<float>(const AttnPartials<float>&, int64_t, int64_t,
                                                     int64_t, float*, float*, cudaStream_t);
extern template absl::Status MergeAttnStatesN<__nv_bfloat16>(const AttnPartials<__nv_bfloat16>&,
                                                             int64_t, int64_t, int64_t,
                                                             __nv_bfloat16*, float*, cudaStream_t);
extern template absl::Status MergeAttnStatesN<__half>(const AttnPartials<__half>&, int64_t, int64_t,
                                                      int64_t, __half*, float*, cudaStream_t);

// MergeAttnStatesN of fp32 partials (split-KV's) rounded once straight into T's out: no fp32
// merged copy and conversion pass. The same checks; out 8-byte aligned.
template <typename T>
absl::Status MergeF32AttnStatesN(const AttnPartials<float>& parts, int64_t num_tokens,
                                 int64_t num_heads, int64_t head_dim, T* out, float* lse,
                                 cudaStream_t stream);

extern template absl::Status MergeF32AttnStatesN<__nv_bfloat16>(const AttnPartials<float>&, int64_t,
                                                                int64_t, int64_t, __nv_bfloat16*,
                                                                float*, cudaStream_t);
extern template absl::Status MergeF32AttnStatesN<__half>(const AttnPartials<float>&, int64_t,
                                                         int64_t, int64_t, __half*, float*,
                                                         cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_MERGE_ATTN_STATES_CUDA_H_
