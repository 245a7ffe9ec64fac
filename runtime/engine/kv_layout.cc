#include "runtime/engine/kv_layout.h"

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

int64_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kFp8E4m3:
      return 1;
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
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

absl::StatusOr<KvDtype> ParseKvCacheDtype(absl::string_view flag, KvDtype activation) {
  if (flag == "auto") return activation;
  if (flag == "fp8" || flag == "fp8_e4m3") return KvDtype::kFp8E4m3;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_cache_dtype must be auto, fp8 or fp8_e4m3, got '", flag, "'"));
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
  const kernels::KvCacheLayout layout =
      KvLayoutForModel(model, /*num_blocks=*/1, block_size, share);
  const int64_t scales =
      dtype == KvDtype::kFp8E4m3 && model.IsMla() ? layout.BlockElems() / layout.head_dim * 4 : 0;
  return layout.BlockElems() * KvDtypeBytes(dtype) + scales;
}

Fp8LatentPool Fp8LatentBlocks(void* pool, const kernels::KvCacheLayout& layout) {
  auto* codes = static_cast<uint8_t*>(pool);
  const int64_t rows = layout.BlockElems() / layout.head_dim;
  return {codes, reinterpret_cast<float*>(codes + layout.BlockElems()),
          layout.BlockElems() + rows * static_cast<int64_t>(sizeof(float))};
}

Fp8LatentPool SplitFp8LatentPool(void* pool, const kernels::KvCacheLayout& layout) {
  auto* codes = static_cast<uint8_t*>(pool);
  return {codes, reinterpret_cast<float*>(codes + layout.TotalElems())};
}

absl::Status CheckFp8LatentPool(const kernels::KvCacheLayout& layout) {
  if (layout.num_planes != 1 || layout.num_kv_heads != 1 || layout.BlockElems() % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an FP8 latent KV pool needs the latent layout (1 plane, 1 head; got ", layout.num_planes,
        ", ", layout.num_kv_heads, ") with num_layers * block_size * latent width (",
        layout.num_layers, " * ", layout.block_size, " * ", layout.head_dim,
        ") a multiple of 16 (a block size that is a multiple of 16 always is)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
