// The dense 16-bit products of the CUDA decoders (CudaLlamaModel, CudaMlaModel, CudaMtpModel):
// out [m, n] = a [m, k] . w^T (+ bias), decode-sized products (m <= kGemvRows) on the
// weight-streaming GEMV (kernels/gemm/cuda/gemv_cuda.h, fp32 accumulation, one rounding to TOut),
// the rest on cuBLASLt (kernels/gemm/cuda/gemm_cuda.h). The two differ only in the fp32
// summation order.
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_RUNTIME_CUDA_DENSE_LINEAR_H_
#define TANDEM_RUNTIME_CUDA_DENSE_LINEAR_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::runtime::cuda {

// Decode products with at most this many rows run on the GEMV; larger ones on cuBLASLt. Measured
// on the H200 (Llama-3-8B decode step): batch 1 4.97 -> 4.74 ms with it; batch 4 was slower with
// it (5.97 ms: the kernel re-reads the activations from L1 once per weight vector and row).
inline constexpr int64_t kGemvRows = 1;

// True when DenseLinear runs these arguments on the GEMV.
inline bool UseGemv(const void* a, const void* w, int64_t m, int64_t n, int64_t k) {
  return m <= kGemvRows && kernels::cuda::SmallMLinearSupported(a, w, m, n, k);
}

// out = a . w^T (+ bias; null: none). T: __nv_bfloat16 or __half; TOut: T or float.
// pdl: programmatic dependent launch for the GEMV (cuBLASLt launches as usual).
template <typename T, typename TOut>
absl::Status DenseLinear(kernels::cuda::CublasLtGemm& gemm, const T* a, const T* w, const T* bias,
                         int64_t m, int64_t n, int64_t k, TOut* out, cudaStream_t stream,
                         bool pdl) {
  if (UseGemv(a, w, m, n, k)) {
    return kernels::cuda::SmallMLinear<T, TOut>(a, w, bias, m, n, k, out, stream, pdl);
  }
  return gemm.Linear<T, TOut>(a, w, bias, m, n, k, out, stream);
}

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DENSE_LINEAR_H_
