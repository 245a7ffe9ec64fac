// The RMSNorm prologue of the batch-1 GEMVs with the norm folded in (gemv_cuda.h's
// SmallMLinearNormIn*, kernels/fp8/fp8_w8a16_gemv_cuda.h's Fp8W16GemvNormIn*): every CTA stages
// RmsNorm(x) * weight of the rows it multiplies in shared memory, bit-identical to RmsNorm<T>
// (kernels/layers/cuda/layers_cuda.h). Internal device code: include from .cu files only.
#ifndef TANDEM_KERNELS_GEMM_CUDA_GEMV_NORM_STAGE_CUH_
#define TANDEM_KERNELS_GEMM_CUDA_GEMV_NORM_STAGE_CUH_

#include <cstdint>

#include "common/block_reduce.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::gemv_internal {

// RmsNorm(x) * weight of the M rows of x [M, k] into `staged` [M, k] (shared memory), with
// RmsNormKernel's arithmetic (layers_cuda.cu) at its 256 threads, this block's: thread t sums
// the squares of elements 8 t .. 8 t + 7, then 8 (t + 256) .. and so on with fmaf, BlockSum adds
// the threads in its fixed order, and each output is round_T((x * inv_rms) * weight), so the
// staged rows are bit-identical to RmsNorm<T>'s output. weight_smem: [k] of shared memory, the
// norm weight staged in the same round of global loads as x. Every thread of the block calls it
// (barriers); REQUIRES blockDim.x == 256 and k a multiple of 8.
template <typename T, int M>
__device__ __forceinline__ void StageRmsNorm(const T* __restrict__ x, const T* __restrict__ weight,
                                             int64_t k, float eps, T* staged, T* weight_smem) {
  constexpr int kThreads = 256;  // RmsNormKernel's block size (kNormThreads)
  using V = internal::Vec<T, 8>;
  __shared__ float warp_sums[kThreads / 32];
  float sum_sq[M];
#pragma unroll
  for (int r = 0; r < M; ++r) sum_sq[r] = 0.0f;
#pragma unroll 2
  for (int64_t i = threadIdx.x * 8; i < k; i += kThreads * 8) {
    *reinterpret_cast<V*>(weight_smem + i) = *reinterpret_cast<const V*>(weight + i);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const V v = *reinterpret_cast<const V*>(x + r * k + i);
      *reinterpret_cast<V*>(staged + r * k + i) = v;
      float f[8];
      internal::VecToFloat(v, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq[r] = fmaf(f[j], f[j], sum_sq[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const float inv_rms =
        rsqrtf(BlockSum<kThreads>(sum_sq[r], warp_sums) / static_cast<float>(k) + eps);
    for (int64_t i = threadIdx.x * 8; i < k; i += kThreads * 8) {
      V* v = reinterpret_cast<V*>(staged + r * k + i);
      float f[8], wf[8];
      internal::VecToFloat(*v, f);
      internal::VecToFloat(*reinterpret_cast<const V*>(weight_smem + i), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) v->v[j] = internal::FromFloat<T>((f[j] * inv_rms) * wf[j]);
    }
    __syncthreads();  // warp_sums is reused by the next row; every row staged before the dots
  }
}

// StageRmsNorm's warp sums (static shared memory beside a launch's dynamic bytes).
inline constexpr int64_t kStageRmsNormStaticSmemBytes = 256 / 32 * sizeof(float);

}  // namespace tandem::kernels::cuda::gemv_internal

#endif  // TANDEM_KERNELS_GEMM_CUDA_GEMV_NORM_STAGE_CUH_
