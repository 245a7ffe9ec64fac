#include "runtime/engine/kv_layout.h"

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
  // A rank holding 2 of the 8 KV heads (TP 4) keeps a quarter of each block.
  EXPECT_EQ(KvLayoutForModel(model, 1, 16, {2, 2}).num_kv_heads, 2);
  EXPECT_EQ(KvBlockBytes(model, 16, KvDtype::kBf16, {2, 2}) * 4,
            KvBlockBytes(model, 16, KvDtype::kBf16));
}

TEST(KvLayoutTest, DtypeNamesAndSizes) {
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF32), 4);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF16), 2);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kBf16), 2);
  EXPECT_STREQ(KvDtypeName(KvDtype::kF32), "float32");
  EXPECT_STREQ(KvDtypeName(KvDtype::kF16), "float16");
  EXPECT_STREQ(KvDtypeName(KvDtype::kBf16), "bfloat16");
}

}  // namespace
}  // namespace tandem::runtime
