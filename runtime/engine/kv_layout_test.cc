#include "runtime/engine/kv_layout.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

TEST(KvLayoutTest, LayoutAndBlockBytesFollowTheModelAndTheDtype) {
  ModelConfig model = *PresetConfig("llama3-8b");  // 32 layers, 8 KV heads, head_dim 128
  const kernels::KvCacheLayout layout = KvLayoutForModel(model, 100, 16);
  EXPECT_EQ(layout.num_blocks, 100);
  EXPECT_EQ(layout.num_layers, 32);
  EXPECT_EQ(layout.block_size, 16);
  EXPECT_EQ(layout.num_kv_heads, 8);
  EXPECT_EQ(layout.head_dim, 128);
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kBf16), 32 * 2 * 16 * 8 * 128 * 2);
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kF32), 32 * 2 * 16 * 8 * 128 * 4);
  // A GQA FP8 pool (--kv_cache_dtype=fp8 on CUDA): one byte a value, its scales per tensor, not
  // in the block.
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kFp8E4m3), 32 * 2 * 16 * 8 * 128);
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kFp8E4m3, {2, 2}) * 4,
            KvBlockBytes(model, 16, KvDtype::kFp8E4m3));
  // A rank holding 2 of the 8 KV heads (TP 4) keeps a quarter of each block.
  EXPECT_EQ(KvLayoutForModel(model, 1, 16, {2, 2}).num_kv_heads, 2);
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kBf16, {2, 2}) * 4,
            KvBlockBytes(model, 16, KvDtype::kBf16));
}

// DeepSeek MLA keeps one latent row (kv_lora_rank + qk_rope_head_dim) per token and layer,
// whatever the heads or the rank's share: bf16 bytes per token of DeepSeek-V2-Lite (27 layers,
// 512 + 64) are 31,104 against Llama-3-8B's 131,072 (4.2x fewer), of DeepSeek-V3 (61 layers)
// 70,272 (16,384 values a layer for Llama-3-70B's K and V against 576).
TEST(KvLayoutTest, MlaLatentRowPerTokenAndLayer) {
  ModelConfig v2_lite;
  v2_lite.num_hidden_layers = 27;
  v2_lite.num_attention_heads = v2_lite.num_key_value_heads = 16;
  v2_lite.head_dim = 64;
  v2_lite.kv_lora_rank = 512;
  v2_lite.qk_rope_head_dim = 64;
  const kernels::KvCacheLayout layout = KvLayoutForModel(v2_lite, 10, 16, {4, 4});
  EXPECT_EQ(layout.num_planes, 1);
  EXPECT_EQ(layout.num_kv_heads, 1);
  EXPECT_EQ(layout.head_dim, 576);
  EXPECT_EQ(KvBlockBytes(v2_lite, 16, KvDtype::kBf16) / 16, 31104);
  EXPECT_EQ(KvBlockBytes(*PresetConfig("llama3-8b"), 16, KvDtype::kBf16) / 16, 131072);
  ModelConfig v3 = v2_lite;
  v3.num_hidden_layers = 61;
  EXPECT_EQ(KvBlockBytes(v3, 16, KvDtype::kBf16) / 16, 70272);
}

TEST(KvLayoutTest, DtypeNamesAndSizes) {
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF32), 4);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF16), 2);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kBf16), 2);
  EXPECT_STREQ(KvDtypeName(KvDtype::kF32), "float32");
  EXPECT_STREQ(KvDtypeName(KvDtype::kF16), "float16");
  EXPECT_STREQ(KvDtypeName(KvDtype::kBf16), "bfloat16");
  EXPECT_EQ(KvDtypeBytes(KvDtype::kFp8E4m3), 1);
  EXPECT_STREQ(KvDtypeName(KvDtype::kFp8E4m3), "fp8_e4m3");
  EXPECT_EQ(*ParseKvCacheDtype("auto", KvDtype::kBf16), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvCacheDtype("fp8", KvDtype::kF32), KvDtype::kFp8E4m3);
  EXPECT_EQ(*ParseKvCacheDtype("fp8_e4m3", KvDtype::kF32), KvDtype::kFp8E4m3);
  EXPECT_EQ(ParseKvCacheDtype("int8", KvDtype::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An FP8 latent block: one code per latent value plus one fp32 scale per (token, layer) row, 580
// bytes per token and layer at DeepSeek-V3's 512 + 64 (1,152 in bf16); planar (CUDA): every
// block's codes, then every block's scales, the scale of the row at code offset e at
// scales[e / width]; blocks (CPU): each block its codes then its scales.
TEST(KvLayoutTest, Fp8LatentBlocksAndPool) {
  ModelConfig v3;
  v3.num_hidden_layers = 61;
  v3.num_attention_heads = v3.num_key_value_heads = 128;
  v3.head_dim = 64;
  v3.kv_lora_rank = 512;
  v3.qk_rope_head_dim = 64;
  EXPECT_EQ(KvBlockBytes(v3, 16, KvDtype::kFp8E4m3), 61 * 16 * 580);
  const kernels::KvCacheLayout layout = KvLayoutForModel(v3, 3, 16);
  EXPECT_TRUE(CheckFp8LatentPool(layout).ok());
  std::vector<uint8_t> pool(3 * KvBlockBytes(v3, 16, KvDtype::kFp8E4m3));
  const Fp8LatentPool split = SplitFp8LatentPool(pool.data(), layout);
  EXPECT_EQ(split.codes, pool.data());
  EXPECT_EQ(reinterpret_cast<uint8_t*>(split.scales), pool.data() + layout.TotalElems());
  EXPECT_EQ(reinterpret_cast<uint8_t*>(split.scales + layout.TotalElems() / 576),
            pool.data() + pool.size());
  // The blocks form (the CPU's, what moves P -> D): block b is one range at b * KvBlockBytes,
  // its codes then its scales; block 1's scales end where block 2 begins.
  const Fp8LatentPool blocks = Fp8LatentBlocks(pool.data(), layout);
  EXPECT_EQ(blocks.block_bytes, KvBlockBytes(v3, 16, KvDtype::kFp8E4m3));
  EXPECT_EQ(blocks.codes, pool.data());
  EXPECT_EQ(reinterpret_cast<uint8_t*>(blocks.scales), pool.data() + layout.BlockElems());
  EXPECT_EQ(reinterpret_cast<uint8_t*>(blocks.scales + 2 * blocks.block_bytes / 4),
            pool.data() + 2 * blocks.block_bytes + layout.BlockElems());
  EXPECT_EQ(reinterpret_cast<uint8_t*>(blocks.scales + blocks.block_bytes / 4 + 61 * 16),
            pool.data() + 2 * blocks.block_bytes);
  EXPECT_EQ(split.block_bytes, 0);
  // A K/V layout, or codes of a block that are not a multiple of 16 bytes, are refused by number.
  EXPECT_FALSE(CheckFp8LatentPool(KvLayoutForModel(*PresetConfig("llama3-8b"), 1, 16)).ok());
  v3.num_hidden_layers = 1;
  v3.kv_lora_rank = 30;
  v3.qk_rope_head_dim = 6;
  const absl::Status odd = CheckFp8LatentPool(KvLayoutForModel(v3, 1, 3));
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("1 * 3 * 36"), std::string::npos) << odd;
}

}  // namespace
}  // namespace tandem::runtime
