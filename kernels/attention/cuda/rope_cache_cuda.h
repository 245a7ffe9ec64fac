// Fused decode-path kernel: RoPE on q and k of a fused qkv projection, q written dense for the
// attention kernel, rotated k and v written straight into their KV-pool slots. Replaces
// ApplyRope + ReshapeAndCache + a strided q copy (three graph nodes per layer) with one, with
// exactly their arithmetic (same fp32 rotation and one rounding to T; a pool of T's dtype copies
// exactly, an fp8 e4m3 pool quantizes the T values as ReshapeAndCache does).
//
// Thread safety: asynchronous on `stream`; writes q_out and the pool slots named by
// slot_mapping (callers never run two writers of one slot concurrently).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_ROPE_CACHE_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_ROPE_CACHE_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"

namespace tandem::kernels::cuda {

namespace rope_internal {
// The shape checks RopeQkvToCache and QkNormRopeQkvToCache share (INVALID_ARGUMENT naming `name`):
// the cache view (ValidateDeviceKvCache: an fp8 pool needs k_scale and v_scale), a pool of the
// activations' own dtype `own` or kFp8E4m3 (any other named in the message), the layer, sizes,
// head_dim / 2 a multiple of 8 (and <= max_head_dim when > 0), qkv_stride covering a row and a
// multiple of 8.
absl::Status ValidateRopeQkvShape(const char* name, const DeviceKvCache& cache, KvDtype own,
                                  int64_t layer, int64_t num_tokens, int64_t num_q_heads,
                                  int64_t qkv_stride, int64_t max_head_dim);
}  // namespace rope_internal

// qkv: [num_tokens, qkv_stride] of T, each row q (num_q_heads x head_dim), then k and v
// (num_kv_heads x head_dim each); positions, slot_mapping: [num_tokens] (device; slot -1 or
// outside the pool: k/v not written); inv_freq: [head_dim / 2] fp32 (device);
// q_out: [num_tokens, num_q_heads, head_dim] of T (rotated q). The pool, with the layout's
// num_kv_heads / head_dim, holds T's own dtype (bf16 / fp16: the rotated k and v stored as T) or
// kFp8E4m3: each rotated k value, rounded to T as for a T pool, stored as e4m3(float(k) / k_scale)
// (a true division, round to nearest, saturated to +-448), v as e4m3(float(v) / v_scale), the
// scale cache.k_scale / v_scale[0], or [kv head] when cache.per_head_scale: bit-identical to a T
// pool's rows written into the fp8 pool by ReshapeAndCache<T>. q_out is T either way.
// INVALID_ARGUMENT (nothing launched): invalid cache view (an fp8 pool without k_scale or
// v_scale included), layer out of range, another pool dtype (the other 16-bit type, int8),
// head_dim / 2 not a multiple of 8, qkv_stride smaller than a row or not a multiple of 8,
// null or unaligned pointers. num_tokens == 0: OK, nothing launched.
// pdl: launched with programmatic dependent launch (waits for the previous kernel before reading
// qkv, then lets the next kernel, e.g. a PDL-launched paged decode, start).
template <typename T>
absl::Status RopeQkvToCache(const T* qkv, int64_t qkv_stride, const int64_t* positions,
                            const int64_t* slot_mapping, int64_t num_tokens, const float* inv_freq,
                            int64_t num_q_heads, T* q_out, const DeviceKvCache& cache,
                            int64_t layer, cudaStream_t stream, bool pdl = false);

extern template absl::Status RopeQkvToCache<__nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                           const int64_t*, const int64_t*, int64_t,
                                                           const float*, int64_t, __nv_bfloat16*,
                                                           const DeviceKvCache&, int64_t,
                                                           cudaStream_t, bool);
extern template absl::Status RopeQkvToCache<__half>(const __half*, int64_t, const int64_t*,
                                                    const int64_t*, int64_t, const float*, int64_t,
                                                    __half*, const DeviceKvCache&, int64_t,
                                                    cudaStream_t, bool);

// Qwen3's per-head q/k RMSNorm (q_norm / k_norm) fused in: each q and k head of the row is first
// normalised exactly as QkHeadRmsNorm (kernels/layers/cuda/head_norm_cuda.h) does in place
// (fp32, the same reduction order, rounded to T), then rotated and written as RopeQkvToCache
// does: q_out and the pool bit-identical to QkHeadRmsNorm + RopeQkvToCache, one kernel instead
// of two, and qkv itself is not modified. q_norm, k_norm: [head_dim] of T (device). One warp per
// (token, head). Same contract as RopeQkvToCache (pools of T's dtype or fp8 e4m3, quantized the
// same way from the normalised, rotated T values; int8 refused), plus head_dim <= 1024 and non-null
// norm weights (INVALID_ARGUMENT otherwise).
template <typename T>
absl::Status QkNormRopeQkvToCache(const T* qkv, int64_t qkv_stride, const int64_t* positions,
                                  const int64_t* slot_mapping, int64_t num_tokens,
                                  const float* inv_freq, int64_t num_q_heads, const T* q_norm,
                                  const T* k_norm, float eps, T* q_out, const DeviceKvCache& cache,
                                  int64_t layer, cudaStream_t stream, bool pdl = false);

extern template absl::Status QkNormRopeQkvToCache<__nv_bfloat16>(
    const __nv_bfloat16*, int64_t, const int64_t*, const int64_t*, int64_t, const float*, int64_t,
    const __nv_bfloat16*, const __nv_bfloat16*, float, __nv_bfloat16*, const DeviceKvCache&,
    int64_t, cudaStream_t, bool);
extern template absl::Status QkNormRopeQkvToCache<__half>(const __half*, int64_t, const int64_t*,
                                                          const int64_t*, int64_t, const float*,
                                                          int64_t, const __half*, const __half*,
                                                          float, __half*, const DeviceKvCache&,
                                                          int64_t, cudaStream_t, bool);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_ROPE_CACHE_CUDA_H_
