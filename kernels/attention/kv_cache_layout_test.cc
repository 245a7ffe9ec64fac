#include "kernels/attention/kv_cache_layout.h"

#include <cstdint>
#include <limits>
#include <set>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

KvCacheLayout SmallLayout() {
  return {.num_blocks = 5, .num_layers = 3, .block_size = 4, .num_kv_heads = 2, .head_dim = 7};
}

TEST(KvCacheLayoutTest, Sizes) {
  const KvCacheLayout layout = SmallLayout();
  EXPECT_TRUE(layout.Validate().ok());
  EXPECT_EQ(layout.TileElems(), 4 * 2 * 7);
  EXPECT_EQ(layout.BlockElems(), 3 * 2 * 4 * 2 * 7);
  EXPECT_EQ(layout.TotalElems(), 5 * 3 * 2 * 4 * 2 * 7);
  EXPECT_EQ(layout.NumSlots(), 20);
}

TEST(KvCacheLayoutTest, TilesAreBlockMajorAndTileTheWholePool) {
  const KvCacheLayout layout = SmallLayout();
  std::set<int64_t> offsets;
  for (int64_t block = 0; block < layout.num_blocks; ++block) {
    for (int64_t layer = 0; layer < layout.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t offset = layout.TileOffset(block, layer, kv);
        // [num_blocks][num_layers][2][block_size][num_kv_heads][head_dim], written out.
        EXPECT_EQ(offset, ((block * 3 + layer) * 2 + kv) * 4 * 2 * 7);
        // One block is one contiguous region.
        EXPECT_GE(offset, block * layout.BlockElems());
        EXPECT_LE(offset + layout.TileElems(), (block + 1) * layout.BlockElems());
        offsets.insert(offset);
      }
    }
  }
  // Distinct, tile-aligned, and covering [0, TotalElems()) exactly.
  ASSERT_EQ(static_cast<int64_t>(offsets.size()), layout.TotalElems() / layout.TileElems());
  int64_t expected = 0;
  for (int64_t offset : offsets) {
    EXPECT_EQ(offset, expected);
    expected += layout.TileElems();
  }
}

TEST(KvCacheLayoutTest, ValidateNamesTheBadField) {
  struct Case {
    const char* field;
    int64_t KvCacheLayout::*member;
  } cases[] = {{"num_blocks", &KvCacheLayout::num_blocks},
               {"num_layers", &KvCacheLayout::num_layers},
               {"block_size", &KvCacheLayout::block_size},
               {"num_kv_heads", &KvCacheLayout::num_kv_heads},
               {"head_dim", &KvCacheLayout::head_dim}};
  for (const Case& c : cases) {
    for (int64_t bad : {int64_t{0}, int64_t{-3}}) {
      KvCacheLayout layout = SmallLayout();
      layout.*c.member = bad;
      const absl::Status status = layout.Validate();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
      EXPECT_NE(status.message().find(c.field), absl::string_view::npos) << status;
    }
  }
  EXPECT_EQ(KvCacheLayout{}.Validate().code(), absl::StatusCode::kInvalidArgument);
}

// An MLA latent pool: one plane per layer, so blocks are half as large and tiles follow each
// other layer by layer; only 1 and 2 planes exist.
TEST(KvCacheLayoutTest, OneLatentPlanePerLayer) {
  KvCacheLayout layout;
  layout.num_blocks = 5;
  layout.num_layers = 3;
  layout.block_size = 4;
  layout.num_kv_heads = 1;
  layout.head_dim = 576;
  layout.num_planes = 1;
  ASSERT_TRUE(layout.Validate().ok());
  EXPECT_EQ(layout.BlockElems(), 3 * 4 * 576);
  EXPECT_EQ(layout.TotalElems(), 5 * 3 * 4 * 576);
  for (int64_t block = 0; block < 5; ++block) {
    for (int64_t layer = 0; layer < 3; ++layer) {
      EXPECT_EQ(layout.TileOffset(block, layer, 0), (block * 3 + layer) * 4 * 576);
    }
  }
  for (int64_t planes : {0, 3}) {
    layout.num_planes = planes;
    const absl::Status status = layout.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("num_planes"), absl::string_view::npos) << status;
  }
}

TEST(KvCacheLayoutTest, ValidateRejectsOverflow) {
  KvCacheLayout layout = SmallLayout();
  layout.num_blocks = std::numeric_limits<int64_t>::max() / 8;
  const absl::Status status = layout.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("overflow"), absl::string_view::npos) << status;

  layout = SmallLayout();
  layout.head_dim = int64_t{1} << 40;
  layout.num_blocks = int64_t{1} << 20;
  EXPECT_EQ(layout.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels
