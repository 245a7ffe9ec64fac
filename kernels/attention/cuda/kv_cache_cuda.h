// Device-side view of the paged KV pool (kernels/attention/kv_cache_layout.h) for the CUDA
// kernels: same block-major layout [num_blocks][num_layers][2][block_size][num_kv_heads][head_dim],
// with the element type chosen at run time.
//
// int8 pools carry a second, parallel scale pool of fp32, one scale per (token, kv head) row,
// laid out like the pool minus head_dim and also block-major:
//
//   [num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads]   (fp32)
//
// so the row at pool element offset e (always a multiple of head_dim) has its scale at
// token_scales[e / head_dim], and block b's scales are one contiguous range of
// KvScaleBlockBytes(layout) bytes at byte offset b * KvScaleBlockBytes(layout): a KV transfer
// moves a block as two ranges (its data, KvDtypeBytes * layout.BlockElems() bytes, and its scales).
//
// Thread safety: plain values; views do not synchronize access to the pool they point at.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_KV_CACHE_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_KV_CACHE_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/attention/paged_attention.h"

namespace tandem::kernels::cuda {

// Element type of the pool.
// kFp8E4m3 stores round(x / scale) saturated to +-448 and reads back stored * scale, the scale
// per tensor or per kv head (DeviceKvCache::k_scale / v_scale).
// kInt8 quantizes each (token, kv head) row of head_dim values on its own (Int8QuantizeRow):
// scale = max|x| / 127, stored = round-half-even(x / scale) clamped to [-127, 127], read back as
// stored * scale; the scales live in DeviceKvCache::token_scales.
enum class KvDtype { kBf16, kFp16, kFp8E4m3, kInt8 };

int64_t KvDtypeBytes(KvDtype dtype);
const char* KvDtypeName(KvDtype dtype);

// fp32 scales of one block of an int8 pool: num_layers * 2 * block_size * num_kv_heads, and the
// same in bytes (x 4). Block b's scales start at element b * KvScaleBlockElems(layout).
int64_t KvScaleBlockElems(const KvCacheLayout& layout);
int64_t KvScaleBlockBytes(const KvCacheLayout& layout);

// Non-owning view of a device pool of layout.TotalElems() elements of `dtype`.
struct DeviceKvCache {
  void* data = nullptr;  // device, 16-byte aligned
  KvCacheLayout layout;
  KvDtype dtype = KvDtype::kBf16;
  // fp8 only (ignored otherwise): device fp32 dequantization scales, [num_kv_heads] when
  // per_head_scale, else [1]. Must be finite and > 0.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool per_head_scale = false;
  // int8 only (ignored otherwise): device fp32 scale pool of layout.num_blocks *
  // KvScaleBlockElems(layout) floats, 16-byte aligned, layout in the file comment. Written by
  // ReshapeAndCache together with the int8 rows, read by PagedAttention.
  float* token_scales = nullptr;
  // FP8 MLA latent pools only (kernels/mla; ignored otherwise): 0 = planar (every block's codes,
  // then token_scales[e / head_dim] for every row); > 0 = each block one range of this many bytes,
  // its layout.BlockElems() codes then its row scales (token_scales = data + BlockElems() bytes,
  // block b's scales from token_scales + b * latent_block_bytes / 4; runtime/engine/kv_layout.h
  // Fp8LatentBlocks).
  int64_t latent_block_bytes = 0;
};

// OK iff the layout is valid, data is non-null and 16-byte aligned, head_dim * element size is a
// multiple of 16 bytes, fp8 pools have both scales, and int8 pools have 16-byte aligned
// token_scales. INVALID_ARGUMENT naming `op` otherwise.
absl::Status ValidateDeviceKvCache(const DeviceKvCache& cache, const char* op);

// Host twin of the int8 row quantization that ReshapeAndCache runs on the device (bit-exact: the
// same fp32 operations), for tests and host-side tools. x: [n] values; writes q: [n] and returns
// the row's scale:
//   max|x| == 0            -> scale 1, q all 0 (reads back exact zeros);
//   any x NaN or infinite  -> scale NaN, q all 0 (reads back NaN, as a bf16 pool would keep it);
//   otherwise              -> scale = max|x| / 127 (fp32 division),
//                             q = round-half-even(x / scale) clamped to [-127, 127].
float Int8QuantizeRow(const float* x, int64_t n, int8_t* q);

// Host-side checks shared by the attention entry points (PagedAttention, PagedPrefillAttention),
// INVALID_ARGUMENT prefixed with `op`:
//  * ValidateAttentionGeometry: layer in range; the plan's kv heads / head_dim / KV dtype /
//    num_seqs match the cache and batch.
//  * ValidateAttentionParams: scale finite and > 0, softcap finite and >= 0, window_left in
//    [-1, 2^30], a valid DCP shard (DcpShardValid).
//  * ValidateAttentionPointers (only when the step has work): q, out and the batch's device
//    arrays non-null, q and out 16-byte aligned.
absl::Status ValidateAttentionGeometry(const char* op, const DeviceKvCache& cache, int64_t layer,
                                       const AttentionBatch& batch, int64_t plan_kv_heads,
                                       int64_t plan_head_dim, KvDtype plan_kv_dtype,
                                       int64_t plan_num_seqs);
absl::Status ValidateAttentionParams(const char* op, const AttentionParams& params);
absl::Status ValidateAttentionPointers(const char* op, const void* q, const void* out,
                                       const AttentionBatch& batch);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_KV_CACHE_CUDA_H_
