// CUDA KV write: stores the K and V of new tokens into their slots of the device pool (the CUDA
// twin of kernels/attention/reshape_and_cache.h).
//
// Thread safety: writes the pool asynchronously on `stream`; callers order it before readers
// of the same slots (same stream) and never run two writers of one slot concurrently.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_RESHAPE_AND_CACHE_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_RESHAPE_AND_CACHE_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"

namespace tandem::kernels::cuda {

// Writes each token's K and V of `layer` at slot = block_id * block_size + offset.
// k, v: [num_tokens, num_kv_heads, head_dim] of T (device; rows may be strided:
// k_token_stride / v_token_stride elements between tokens, e.g. slices of a fused qkv output);
// slot_mapping: [num_tokens] (device). Slot -1 means skip.
// T is __nv_bfloat16 or __half. The pool's dtype is T's own (bf16/fp16: copied exactly),
// kFp8E4m3 (stored = saturate(round(x / scale)) with the per-tensor or per-head scale), or kInt8
// (each (token, kv head) row quantized on its own and its scale written to
// cache.token_scales, bit-exact with Int8QuantizeRow in kv_cache_cuda.h).
//
// INVALID_ARGUMENT (nothing launched) for an invalid cache view, layer out of range,
// num_tokens < 0, null inputs while num_tokens > 0, a bf16/fp16 pool of the other type, strides
// smaller than a row, or unaligned rows. Unlike the CPU op, slots are not checked on the host
// (they live on the device): a slot < -1 or >= num_slots is skipped like -1. Asynchronous.
template <typename T>
absl::Status ReshapeAndCache(const T* k, const T* v, const int64_t* slot_mapping,
                             int64_t num_tokens, int64_t layer, const DeviceKvCache& cache,
                             cudaStream_t stream, int64_t k_token_stride = -1,
                             int64_t v_token_stride = -1);

extern template absl::Status ReshapeAndCache<__nv_bfloat16>(const __nv_bfloat16*,
                                                            const __nv_bfloat16*, const int64_t*,
                                                            int64_t, int64_t, const DeviceKvCache&,
                                                            cudaStream_t, int64_t, int64_t);
extern template absl::Status ReshapeAndCache<__half>(const __half*, const __half*, const int64_t*,
                                                     int64_t, int64_t, const DeviceKvCache&,
                                                     cudaStream_t, int64_t, int64_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_RESHAPE_AND_CACHE_CUDA_H_
