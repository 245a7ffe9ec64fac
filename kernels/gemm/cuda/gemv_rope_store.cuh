// The RoPE + KV-write epilogue of the batch-1 qkv GEMVs with it folded in (gemv_cuda.h's
// SmallMLinearNormInRopeKv, kernels/fp8/fp8_w8a16_gemv_cuda.h's Fp8W16GemvNormInRopeKv): one
// output pair's rotation and its store into q or the KV pool, with RopeQkvToCache's arithmetic.
// Internal device code: include from .cu files only.
#ifndef TANDEM_KERNELS_GEMM_CUDA_GEMV_ROPE_STORE_CUH_
#define TANDEM_KERNELS_GEMM_CUDA_GEMV_ROPE_STORE_CUH_

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::kernels::cuda::gemv_internal {

// RoPE + KV write of output pair `pair` = (head h, element i < D / 2) of token r, from the two
// products x1 (row h * D + i) and x2 (row h * D + i + D / 2), each already rounded to T as the qkv
// buffer stores it: q and k rotated with RopeQkvToCacheKernel's fp32 expression
// (kernels/attention/cuda/rope_cache_cuda.cu), v copied; q dense, k / v into the token's slot
// (nothing for slots < 0 or >= num_slots). T: q_out's element type and the pool's, or with
// d.k_scale set the pool holds e4m3 codes of the T values (RopeQkvToCache's FP8 codes).
template <typename T>
__device__ __forceinline__ void RopeKvStore(const GemvRopeKv& d, int64_t pair, int r, float x1,
                                            float x2) {
  const int half = d.head_dim / 2;
  const int64_t h = pair / half;
  const int i = static_cast<int>(pair % half);
  int64_t at;  // element offset of the row in q_out or the pool
  bool is_v = false, in_pool = false;
  if (h < d.num_q_heads) {
    at = (r * d.num_q_heads + h) * d.head_dim;
  } else {
    const int64_t slot = d.slot_mapping[r];
    if (slot < 0 || slot >= d.num_slots) return;
    is_v = h >= d.num_q_heads + d.num_kv_heads;
    in_pool = true;
    const int64_t kv_head = h - d.num_q_heads - (is_v ? d.num_kv_heads : 0);
    at = (slot / d.block_size) * d.block_stride + d.layer_tile_offset + (is_v ? d.kv_stride : 0) +
         ((slot % d.block_size) * d.num_kv_heads + kv_head) * d.head_dim;
  }
  T y1, y2;
  if (is_v) {
    y1 = internal::FromFloat<T>(x1);
    y2 = internal::FromFloat<T>(x2);
  } else {
    float s, c;
    sincosf(static_cast<float>(d.positions[r]) * d.inv_freq[i], &s, &c);
    y1 = internal::FromFloat<T>(x1 * c + (-x2) * s);
    y2 = internal::FromFloat<T>(x2 * c + x1 * s);
  }
  if (in_pool && d.k_scale != nullptr) {  // an FP8 pool: a true division, as ReshapeAndCache
    const float scale = is_v ? d.v_scale[0] : d.k_scale[0];
    __nv_fp8_e4m3* dst = static_cast<__nv_fp8_e4m3*>(d.pool) + at;
    dst[i] = internal::FromFloat<__nv_fp8_e4m3>(internal::ToFloat(y1) / scale);
    dst[i + half] = internal::FromFloat<__nv_fp8_e4m3>(internal::ToFloat(y2) / scale);
    return;
  }
  T* dst = static_cast<T*>(in_pool ? d.pool : d.q_out) + at;
  dst[i] = y1;
  dst[i + half] = y2;
}

}  // namespace tandem::kernels::cuda::gemv_internal

#endif  // TANDEM_KERNELS_GEMM_CUDA_GEMV_ROPE_STORE_CUH_
