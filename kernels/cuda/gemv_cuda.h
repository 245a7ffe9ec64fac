// Small-batch linear layer (decode): out[m, n] = a[m, k] . w[n, k] (+ bias[n]) for m <= 8, the
// shapes where a GEMM library's tensor-core tiles idle and the cost is reading w once. One warp
// per output row streams the row with 16-byte loads (several in flight per lane), keeps the m
// activations' dot products in fp32 registers and reduces them with shuffles.
//
// Measured motivation (H200, Llama-3-8B shapes, m = 1): cuBLASLt read the qkv and o_proj weights
// at 58-70% of 4.3 TB/s.
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_KERNELS_CUDA_GEMV_CUDA_H_
#define TANDEM_KERNELS_CUDA_GEMV_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kGemvMaxM = 8;

// True when SmallMLinear takes these arguments: 1 <= m <= kGemvMaxM, n >= 1, k a positive
// multiple of 8, a / w 16-byte aligned (rows are then 16-byte aligned too).
bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k);

// a: [m, k] of T; w: [n, k] of T (nn.Linear layout); bias: [n] of T or null; out: [m, n] of TOut
// (T or float), not overlapping the inputs. fp32 accumulation, one rounding to TOut (after the
// bias add). T is __nv_bfloat16 or __half. INVALID_ARGUMENT (nothing launched) unless
// SmallMLinearSupported and out is non-null.
template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream);

#define TANDEM_GEMV_CUDA_EXTERN(T, TOut)                                                    \
  extern template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t, \
                                                     int64_t, int64_t, TOut*, cudaStream_t);
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_EXTERN(__half, __half)
TANDEM_GEMV_CUDA_EXTERN(__half, float)
#undef TANDEM_GEMV_CUDA_EXTERN

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_GEMV_CUDA_H_
