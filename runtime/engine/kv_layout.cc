#include "runtime/engine/kv_layout.h"

namespace tandem::runtime {

int64_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBf16:
      return 2;
  }
  return 0;
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "float32";
    case KvDtype::kF16:
      return "float16";
    case KvDtype::kBf16:
      return "bfloat16";
  }
  return "unknown";
}

kernels::KvCacheLayout KvLayoutForModel(const ModelConfig& model, int64_t num_blocks,
                                        int64_t block_size, KvHeadShare share) {
  kernels::KvCacheLayout layout;
  layout.num_blocks = num_blocks;
  layout.num_layers = model.num_hidden_layers;
  layout.block_size = block_size;
  if (model.IsMla()) {
    // One latent row per token and layer, [c_kv | k_pe], the same on every rank (not split by
    // heads): kernels/mla.
    layout.num_planes = 1;
    layout.num_kv_heads = 1;
    layout.head_dim = model.kv_lora_rank + model.qk_rope_head_dim;
    return layout;
  }
  layout.num_kv_heads = share.count < 0 ? model.num_key_value_heads : share.count;
  layout.head_dim = model.head_dim;
  return layout;
}

int64_t KvBlockBytes(const ModelConfig& model, int64_t block_size, KvDtype dtype,
                     KvHeadShare share) {
  return KvLayoutForModel(model, /*num_blocks=*/1, block_size, share).BlockElems() *
         KvDtypeBytes(dtype);
}

}  // namespace tandem::runtime
