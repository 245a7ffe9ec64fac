// FP8 latent KV for multi-head latent attention (issue 33: "FP8 KV (e4m3, per-token scale)"),
// CPU reference.
//
// An FP8 latent pool has the latent layout of mla_attention.h (one plane, one "head" of
// D = kv_lora_rank + qk_rope_head_dim values per token and layer) holding OCP e4m3fn codes, one
// byte per value, plus a parallel fp32 scale pool with ONE scale per (token, layer) row: the row
// at pool element offset e (a multiple of D) has its scale at scales[e / D] (the convention of
// kernels/attention/cuda/kv_cache_cuda.h's int8 token_scales). A row x of D values is stored as
//   scale = max|x| / 448 (1 for an all-zero row), code_i = e4m3(x_i / scale) (nearest, ties to
//   even, saturated to +-448), read back as Fp8E4m3ToFloat(code_i) * scale,
// so c_kv and k_pe share the row's scale and every row uses the whole e4m3 range (relative error
// <= 2^-4 per value above e4m3's subnormals). 577 bytes of KV per token and layer for
// DeepSeek-V3's 512 + 64 latent (580 with the scale) instead of 1152 in bf16.
//
// Attention over an FP8 pool is, by definition, MlaPagedAttention over the dequantized rows:
// MlaPagedAttentionFp8 is that reference (the device kernels are held to it).
//
// Thread safety: pure functions over caller-owned buffers.
#ifndef TANDEM_KERNELS_MLA_MLA_FP8_LATENT_H_
#define TANDEM_KERNELS_MLA_MLA_FP8_LATENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {

// An FP8 latent pool: `codes` [layout.TotalElems()] e4m3fn, `scales` [layout.TotalElems() /
// layout.head_dim] fp32 (planar: every block's codes, then every scale; block_bytes 0), or a
// block-interleaved pool (block_bytes > 0; runtime/engine/kv_layout.h): block b is one range of
// block_bytes at codes + b * block_bytes holding its layout.BlockElems() codes and then its
// layout.BlockElems() / head_dim scales, so `scales` = codes + layout.BlockElems() and block b's
// scales start at scales + b * block_bytes / 4. Within a block both forms are the same: the row at
// in-block code offset e has its scale at in-block index e / head_dim.
struct Fp8LatentCacheView {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  KvCacheLayout layout;
  int64_t block_bytes = 0;  // 0: planar; else a multiple of 4, >= codes + scales of one block
};

// Quantizes one row of `n` values to e4m3 codes with one scale (returned), as above.
float QuantizeLatentRowFp8(const float* x, int64_t n, uint8_t* codes);
// out[i] = Fp8E4m3ToFloat(codes[i]) * scale.
void DequantizeLatentRowFp8(const uint8_t* codes, float scale, int64_t n, float* out);

// WriteLatentCache into an FP8 pool: each row quantized with its own scale. Same checks, and a
// block_bytes that cannot hold a block is INVALID_ARGUMENT.
absl::Status WriteLatentCacheFp8(const float* latent, const int64_t* slot_mapping,
                                 int64_t num_tokens, int64_t layer, Fp8LatentCacheView cache);

// The whole FP8 pool dequantized into `out` (a float latent pool of the same layout; resized).
void DequantizeLatentCacheFp8(const Fp8LatentCacheView& cache, std::vector<float>* out);

// MlaPagedAttention (same arguments and semantics, DCP included) over the dequantized FP8 pool
// (it dequantizes only the blocks the batch's block tables use, at `layer`, so an engine's step
// costs its context, not the pool). INVALID_ARGUMENT for a block id outside the pool.
absl::Status MlaPagedAttentionFp8(const float* q, const float* kv_b_proj, const MlaDims& dims,
                                  const Fp8LatentCacheView& cache, int64_t layer,
                                  const AttentionBatch& batch, float scale, MlaMode mode,
                                  float* out, float* lse, ThreadPool* pool, DcpShard dcp = {});

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_MLA_MLA_FP8_LATENT_H_
