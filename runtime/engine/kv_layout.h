// The one place a worker's KV pool layout is derived from its model (ARCHITECTURE.md, "KV
// cache"): the element type of its KV (KvDtype, chosen by the backend: ExecutorFactory), and the
// block-major layout of one rank's pool (KvLayoutForModel), which the CPU model, the CUDA model,
// the engine's block size in bytes and the worker's transfer compatibility all use.
//
// Thread safety: pure values and functions.
#ifndef TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_
#define TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/attention/kv_cache_layout.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime {

// Element type of a KV pool. kFp8E4m3 (--kv_cache_dtype=fp8) is, for a DeepSeek MLA model, e4m3
// codes of the latent layout with one fp32 scale per (token, layer) row, the format of
// kernels/mla/mla_fp8_latent.h, held as Fp8LatentPool below (both backends); for a GQA model
// (CUDA backend only), e4m3 codes of K and V, code = e4m3(x / scale), one scale per tensor (K or
// V of a layer), outside the blocks: the checkpoint's calibrated k / v scales where it has them
// (config.quantization.kv_cache_fp8: modelopt, compressed-tensors), else kFp8KvTensorScale (vLLM's
// --kv-cache-dtype fp8 without calibrated scales; e4m3 keeps 3 mantissa bits from 2^-6 to 448).
enum class KvDtype { kF32, kF16, kBf16, kFp8E4m3 };
inline constexpr float kFp8KvTensorScale = 1.0f;
int64_t KvDtypeBytes(KvDtype dtype);     // of one element (an FP8 code: 1; its scale not counted)
const char* KvDtypeName(KvDtype dtype);  // "float32", "float16", "bfloat16", "fp8_e4m3"

// --kv_cache_dtype: "auto" (`activation`, the backend's own) or "fp8" / "fp8_e4m3" (KvDtype::
// kFp8E4m3 above; MakeExecutorFactory refuses it for a GQA model on the CPU backend).
// INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<KvDtype> ParseKvCacheDtype(absl::string_view flag, KvDtype activation);

// Which KV heads one rank of a worker group keeps (tensor parallelism splits KV heads; with
// fewer KV heads than ranks each is replicated). The default is the whole model: one rank.
struct KvHeadShare {
  int64_t first = 0;
  int64_t count = -1;  // -1: all of the model's KV heads
};

// [num_blocks][num_layers][2][block_size][heads of `share`][head_dim] for `model`; for a DeepSeek
// MLA model (model.IsMla()) the latent layout [num_blocks][num_layers][1][block_size][1]
// [kv_lora_rank + qk_rope_head_dim], whatever `share` says (the latent is not split by heads).
kernels::KvCacheLayout KvLayoutForModel(const ModelConfig& model, int64_t num_blocks,
                                        int64_t block_size, KvHeadShare share = {});

// Bytes of one block of that layout in `dtype` (every layer's K and V; an FP8 latent block's
// codes and its row scales; a GQA FP8 block's codes only).
int64_t KvBlockBytes(const ModelConfig& model, int64_t block_size, KvDtype dtype,
                     KvHeadShare share = {});

// An FP8 latent pool of num_blocks blocks is num_blocks * KvBlockBytes bytes in one of two forms:
//  * blocks (Fp8LatentBlocks; both backends): block-major like every other pool, block b is ONE
//    range of KvBlockBytes at b * KvBlockBytes, its codes ([num_layers][1][block_size][1][latent
//    width], one byte each) then its fp32 row scales ([num_layers][block_size]; the row at
//    in-block code offset e has its scale at in-block index e / latent width). A block moves
//    P -> D, and is leased, hashed and prefix-cached, as one range like a 16-bit block.
//  * planar (SplitFp8LatentPool; the kernels' other form, token_scales[e / width], kept for
//    their tests; no backend allocates it): every block's codes, then every block's scales.
//    Block b is two ranges there, so a planar pool could not move P -> D.
// The scales start 16-byte aligned (a block's codes are a multiple of 16 bytes:
// CheckFp8LatentPool) and 4-byte aligned in every block.
struct Fp8LatentPool {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t block_bytes = 0;  // the blocks form: KvBlockBytes; planar: 0
};
Fp8LatentPool Fp8LatentBlocks(void* pool, const kernels::KvCacheLayout& layout);
Fp8LatentPool SplitFp8LatentPool(void* pool, const kernels::KvCacheLayout& layout);
// INVALID_ARGUMENT, naming the numbers, unless `layout` is a latent layout (one plane, one head)
// whose block codes are a multiple of 16 bytes.
absl::Status CheckFp8LatentPool(const kernels::KvCacheLayout& layout);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_
