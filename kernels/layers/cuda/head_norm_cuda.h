// Per-head RMSNorm of q and k in place on fused qkv rows (Qwen3's q_norm / k_norm, applied
// before RoPE): for each token and each of its num_q_heads q heads and num_kv_heads k heads,
//   x = round_T((x * rsqrt(mean(x^2) + eps)) * weight), mean over the head's head_dim values,
// fp32 arithmetic as RmsNorm<T> (layers_cuda.h); v is untouched. One warp per (token, head).
//
// Thread safety: stateless; asynchronous on `stream`; capturable in a CUDA graph.
#ifndef TANDEM_KERNELS_LAYERS_CUDA_HEAD_NORM_CUDA_H_
#define TANDEM_KERNELS_LAYERS_CUDA_HEAD_NORM_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// qkv: [num_tokens, qkv_stride] of T (q heads, then k heads, then v heads per row);
// q_weight, k_weight: [head_dim] of T. INVALID_ARGUMENT (nothing launched) for head_dim outside
// [1, 1024], a row shorter than the q and k heads, or null pointers. num_tokens == 0: OK.
template <typename T>
absl::Status QkHeadRmsNorm(T* qkv, int64_t qkv_stride, int64_t num_tokens, int64_t num_q_heads,
                           int64_t num_kv_heads, int64_t head_dim, const T* q_weight,
                           const T* k_weight, float eps, cudaStream_t stream);

extern template absl::Status QkHeadRmsNorm<__nv_bfloat16>(__nv_bfloat16*, int64_t, int64_t, int64_t,
                                                          int64_t, int64_t, const __nv_bfloat16*,
                                                          const __nv_bfloat16*, float,
                                                          cudaStream_t);
extern template absl::Status QkHeadRmsNorm<__half>(__half*, int64_t, int64_t, int64_t, int64_t,
                                                   int64_t, const __half*, const __half*, float,
                                                   cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_LAYERS_CUDA_HEAD_NORM_CUDA_H_
