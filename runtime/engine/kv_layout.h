// The one place a worker's KV pool layout is derived from its model (ARCHITECTURE.md, "KV
// cache"): the element type of its KV (KvDtype, chosen by the backend: ExecutorFactory), and the
// block-major layout of one rank's pool (KvLayoutForModel), which the CPU model, the CUDA model,
// the engine's block size in bytes and the worker's transfer compatibility all use.
//
// Thread safety: pure values and functions.
#ifndef TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_
#define TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_

#include <cstdint>

#include "kernels/attention/kv_cache_layout.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime {

// Element type of a KV pool.
enum class KvDtype { kF32, kF16, kBf16 };
int64_t KvDtypeBytes(KvDtype dtype);
const char* KvDtypeName(KvDtype dtype);  // "float32", "float16", "bfloat16"

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

// Bytes of one block of that layout in `dtype` (every layer's K and V).
int64_t KvBlockBytes(const ModelConfig& model, int64_t block_size, KvDtype dtype,
                     KvHeadShare share = {});

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_KV_LAYOUT_H_
