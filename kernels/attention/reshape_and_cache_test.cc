#include "kernels/attention/reshape_and_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cpu {
namespace {

using ::tandem::kernels::attention_test::RandomNormal;
using ::tandem::kernels::attention_test::TestSeed;

// Index of element (slot, kv head, dim) of K (kv = 0) or V (kv = 1) of `layer`, spelled out
// from [num_blocks][num_layers][2][block_size][num_kv_heads][head_dim] independently of
// KvCacheLayout::TileOffset.
int64_t PoolIndex(const KvCacheLayout& l, int64_t slot, int64_t layer, int kv, int64_t head,
                  int64_t dim) {
  const int64_t block = slot / l.block_size;
  const int64_t offset = slot % l.block_size;
  return ((((block * l.num_layers + layer) * 2 + kv) * l.block_size + offset) * l.num_kv_heads +
          head) *
             l.head_dim +
         dim;
}

class ReshapeAndCacheTest : public ::testing::TestWithParam<int64_t /*block_size*/> {};

TEST_P(ReshapeAndCacheTest, SlotsLandWhereTheLayoutSaysAndNothingElseChanges) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const KvCacheLayout layout = {
      .num_blocks = 7, .num_layers = 3, .block_size = GetParam(), .num_kv_heads = 3, .head_dim = 5};
  ASSERT_TRUE(layout.Validate().ok());
  std::vector<float> pool = RandomNormal(rng, layout.TotalElems(), 1.0f);
  const std::vector<float> before = pool;

  // Distinct random slots, with some tokens skipped (-1).
  std::vector<int64_t> all_slots(layout.NumSlots());
  for (int64_t i = 0; i < layout.NumSlots(); ++i) all_slots[i] = i;
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  const int64_t num_tokens = std::min<int64_t>(layout.NumSlots(), 40);
  std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + num_tokens);
  for (int64_t t = 0; t < num_tokens; t += 3) slots[t] = -1;
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  const std::vector<float> k = RandomNormal(rng, num_tokens * row, 1.0f);
  const std::vector<float> v = RandomNormal(rng, num_tokens * row, 1.0f);
  const int64_t layer = 1;

  ASSERT_TRUE(
      ReshapeAndCache(k.data(), v.data(), slots.data(), num_tokens, layer, {pool.data(), layout})
          .ok());

  std::vector<bool> written(pool.size(), false);
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      for (int64_t d = 0; d < layout.head_dim; ++d) {
        const int64_t ki = PoolIndex(layout, slots[t], layer, 0, h, d);
        const int64_t vi = PoolIndex(layout, slots[t], layer, 1, h, d);
        EXPECT_EQ(pool[ki], k[(t * layout.num_kv_heads + h) * layout.head_dim + d]);
        EXPECT_EQ(pool[vi], v[(t * layout.num_kv_heads + h) * layout.head_dim + d]);
        written[ki] = written[vi] = true;
      }
    }
  }
  // Skipped tokens, other slots and other layers are untouched.
  for (size_t i = 0; i < pool.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(pool[i], before[i]) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, ReshapeAndCacheTest, ::testing::Values(1, 16, 32));

class ReshapeAndCacheErrorTest : public ::testing::Test {
 protected:
  ReshapeAndCacheErrorTest()
      : rng_(TestSeed()),
        pool_(RandomNormal(rng_, layout_.TotalElems(), 1.0f)),
        before_(pool_),
        k_(RandomNormal(rng_, 4 * 2 * 8, 1.0f)),
        v_(RandomNormal(rng_, 4 * 2 * 8, 1.0f)) {}

  void ExpectRejected(const std::vector<int64_t>& slots, int64_t layer) {
    const absl::Status status = ReshapeAndCache(k_.data(), v_.data(), slots.data(),
                                                static_cast<int64_t>(slots.size()), layer, View());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(pool_ == before_) << "pool modified by a rejected call";
  }
  KvCacheView View() { return {pool_.data(), layout_}; }

  const KvCacheLayout layout_ = {
      .num_blocks = 3, .num_layers = 2, .block_size = 4, .num_kv_heads = 2, .head_dim = 8};
  std::mt19937 rng_;
  std::vector<float> pool_;
  const std::vector<float> before_;
  std::vector<float> k_, v_;
};

TEST_F(ReshapeAndCacheErrorTest, BadSlotRejectedWithNothingWritten) {
  // The bad slot comes last, after valid ones: nothing may be written before the check.
  ExpectRejected({0, 5, 7, 12}, 0);  // 12 == num_slots
  ExpectRejected({0, 5, 7, -2}, 0);
  ExpectRejected({0, 5, 7, int64_t{1} << 40}, 1);
}

TEST_F(ReshapeAndCacheErrorTest, BadLayerRejected) {
  ExpectRejected({0, 1, 2, 3}, 2);
  ExpectRejected({0, 1, 2, 3}, -1);
}

TEST_F(ReshapeAndCacheErrorTest, BadArgumentsRejected) {
  const std::vector<int64_t> slots = {0, 1};
  EXPECT_EQ(ReshapeAndCache(k_.data(), v_.data(), slots.data(), -1, 0, View()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReshapeAndCache(nullptr, v_.data(), slots.data(), 2, 0, View()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReshapeAndCache(k_.data(), v_.data(), slots.data(), 2, 0, {nullptr, layout_}).code(),
            absl::StatusCode::kInvalidArgument);
  KvCacheLayout bad = layout_;
  bad.head_dim = 0;
  EXPECT_EQ(ReshapeAndCache(k_.data(), v_.data(), slots.data(), 2, 0, {pool_.data(), bad}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool_ == before_);
}

TEST_F(ReshapeAndCacheErrorTest, AllSkippedOrEmptyWritesNothing) {
  const std::vector<int64_t> slots = {-1, -1, -1, -1};
  EXPECT_TRUE(ReshapeAndCache(k_.data(), v_.data(), slots.data(), 4, 0, View()).ok());
  EXPECT_TRUE(ReshapeAndCache(nullptr, nullptr, nullptr, 0, 0, View()).ok());
  EXPECT_TRUE(pool_ == before_);
}

// The FP8 writer: every value's code is FloatToFp8E4m3(x / scale) (K and V with their own
// scales), at the slots the layout says, out-of-range values saturated, NaN kept NaN, every other
// byte untouched; bad scales refused with nothing written.
TEST(ReshapeAndCacheFp8Test, CodesOfValueOverScaleAtTheirSlots) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const KvCacheLayout layout = {
      .num_blocks = 5, .num_layers = 2, .block_size = 4, .num_kv_heads = 3, .head_dim = 6};
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  std::vector<uint8_t> pool(layout.TotalElems());
  for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
  const std::vector<uint8_t> before = pool;
  const std::vector<int64_t> slots = {7, -1, 0, 19, 12};
  const int64_t T = static_cast<int64_t>(slots.size());
  std::vector<float> k = RandomNormal(rng, T * row, 3.0f), v = RandomNormal(rng, T * row, 0.5f);
  k[1] = 1e6f;  // saturates to +448 * scale
  v[2] = -1e6f;
  k[3] = std::numeric_limits<float>::quiet_NaN();
  const Fp8KvCacheView view{pool.data(), layout, 0.0125f, 0.004f};
  ASSERT_TRUE(ReshapeAndCacheFp8(k.data(), v.data(), slots.data(), T, 1, view).ok());
  std::vector<bool> written(pool.size(), false);
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      for (int64_t j = 0; j < layout.head_dim; ++j) {
        const int64_t i = h * layout.head_dim + j;
        const int64_t ki = PoolIndex(layout, slots[t], 1, 0, h, j);
        const int64_t vi = PoolIndex(layout, slots[t], 1, 1, h, j);
        EXPECT_EQ(pool[ki], FloatToFp8E4m3(k[t * row + i] / view.k_scale)) << t << " " << i;
        EXPECT_EQ(pool[vi], FloatToFp8E4m3(v[t * row + i] / view.v_scale)) << t << " " << i;
        written[ki] = written[vi] = true;
      }
    }
  }
  EXPECT_EQ(Fp8E4m3ToFloat(pool[PoolIndex(layout, 7, 1, 0, 0, 1)]), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(pool[PoolIndex(layout, 7, 1, 1, 0, 2)]), -448.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(pool[PoolIndex(layout, 7, 1, 0, 0, 3)])));
  for (size_t i = 0; i < pool.size(); ++i) {
    if (!written[i]) {
      EXPECT_EQ(pool[i], before[i]) << "byte " << i << " changed";
    }
  }
  const std::vector<uint8_t> after = pool;
  for (float bad : {0.0f, -0.5f, std::numeric_limits<float>::infinity()}) {
    const Fp8KvCacheView bad_view{pool.data(), layout, bad, 1.0f};
    EXPECT_EQ(ReshapeAndCacheFp8(k.data(), v.data(), slots.data(), T, 1, bad_view).code(),
              absl::StatusCode::kInvalidArgument);
  }
  const std::vector<int64_t> bad_slots = {0, 20};
  EXPECT_EQ(ReshapeAndCacheFp8(k.data(), v.data(), bad_slots.data(), 2, 0, view).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool == after) << "a refused call wrote";
}

}  // namespace
}  // namespace tandem::kernels::cpu
