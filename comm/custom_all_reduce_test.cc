// The custom all-reduce's host side (no GPU): the path/size rules, and the kernels' pack
// assignment played on the host (custom_all_reduce_reference.h) against the rank-order fp32
// reference on random bf16 inputs, for world 2/4/8 and sizes from 16 B to 8 MiB.
#include <random>
#include <vector>

#include "comm/custom_all_reduce_layout.h"
#include "comm/custom_all_reduce_reference.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

TEST(CustomAllReduceTest, PathsAndLimits) {
  const ArLimits limits;
  // Not available, not whole packs, too large, odd world sizes: NCCL.
  EXPECT_EQ(PlanAllReduce(8192, 4, false, limits).path, ArPath::kNccl);
  EXPECT_EQ(PlanAllReduce(8190, 4, true, limits).path, ArPath::kNccl);
  EXPECT_EQ(PlanAllReduce(0, 4, true, limits).path, ArPath::kNccl);
  EXPECT_EQ(PlanAllReduce(limits.max_bytes + 16, 2, true, limits).path, ArPath::kNccl);
  for (int world : {1, 3, 5, 6, 16}) {
    EXPECT_EQ(PlanAllReduce(8192, world, true, limits).path, ArPath::kNccl) << world;
  }
  // World 2: one-shot up to the limit; 4: one-shot below 512 KiB; 8: below 256 KiB.
  EXPECT_EQ(PlanAllReduce(limits.max_bytes, 2, true, limits).path, ArPath::kOneShot);
  EXPECT_EQ(PlanAllReduce((512 << 10) - 16, 4, true, limits).path, ArPath::kOneShot);
  EXPECT_EQ(PlanAllReduce(512 << 10, 4, true, limits).path, ArPath::kTwoShot);
  EXPECT_EQ(PlanAllReduce((256 << 10) - 16, 8, true, limits).path, ArPath::kOneShot);
  EXPECT_EQ(PlanAllReduce(256 << 10, 8, true, limits).path, ArPath::kTwoShot);
  EXPECT_EQ(PlanAllReduce(limits.max_bytes, 8, true, limits).path, ArPath::kTwoShot);
  // Shapes: packs of 16 bytes, segments of ceil(packs / world), 1..kArMaxBlocks blocks.
  const ArLaunch small = PlanAllReduce(2048, 4, true, limits);
  EXPECT_EQ(small.packs, 128);
  EXPECT_EQ(small.segment, 128);
  EXPECT_EQ(small.blocks, 1);
  const ArLaunch big = PlanAllReduce((1 << 20) + 48, 4, true, limits);
  EXPECT_EQ(big.packs, 65539);
  EXPECT_EQ(big.segment, 16385);
  EXPECT_EQ(big.blocks, 33);  // ceil(16385 / 512)
  EXPECT_EQ(PlanAllReduce(8 << 20, 2, true, limits).blocks, kArMaxBlocks);
  EXPECT_EQ(ArSegmentPack(big, 3, 16384), -1);  // the last segment is shorter
  EXPECT_EQ(ArSegmentPack(big, 3, 16383), 65538);
}

TEST(CustomAllReduceTest, Bf16RoundingMatchesRoundToNearestEven) {
  EXPECT_EQ(ArFloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(ArBf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(ArFloatToBf16(1.0f + 1.0f / 256), 0x3f80);  // a tie rounds to even
  EXPECT_EQ(ArFloatToBf16(1.0f + 3.0f / 256), 0x3f82);  // a tie rounds to even (up)
  EXPECT_EQ(ArFloatToBf16(-2.5f), 0xc020);
}

std::vector<std::vector<uint16_t>> RandomInputs(std::mt19937& rng, int world, int64_t values) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> inputs(world, std::vector<uint16_t>(values));
  for (auto& in : inputs) {
    for (uint16_t& v : in) v = ArFloatToBf16(normal(rng));
  }
  return inputs;
}

// Every rank gets the reference sum, bit for bit, on both paths and every size class: a pack
// assignment that broke the per-block barriers (a block reading a pack another block wrote) or
// missed / doubled a pack would fail here.
TEST(CustomAllReduceTest, SimulatedKernelsEqualTheReference) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  const ArLimits limits;
  for (int world : {2, 4, 8}) {
    for (int64_t bytes :
         {int64_t{16}, int64_t{2048}, int64_t{8192 + 16}, int64_t{65536},
          int64_t{(256 << 10) + 16 * 7}, int64_t{(512 << 10) - 16}, int64_t{(1 << 20) + 48}}) {
      for (ArPath path : {ArPath::kOneShot, ArPath::kTwoShot}) {
        ArLaunch launch = PlanAllReduce(bytes, world, true, limits);
        ASSERT_NE(launch.path, ArPath::kNccl);
        if (launch.path != path) {  // force the other path on the same size
          ArLimits forced = limits;
          forced.one_shot_below_4 = forced.one_shot_below_8 =
              path == ArPath::kOneShot ? 1 << 30 : 0;
          if (world == 2 && path == ArPath::kTwoShot) continue;  // world 2 is always one-shot
          launch = PlanAllReduce(bytes, world, true, forced);
          ASSERT_EQ(launch.path, path);
        }
        SCOPED_TRACE(::testing::Message() << "world " << world << " bytes " << bytes << " "
                                          << (path == ArPath::kOneShot ? "one" : "two") << "-shot");
        const auto inputs = RandomInputs(rng, world, bytes / 2);
        auto outputs = SimulateAllReduceBf16(inputs, launch);
        ASSERT_TRUE(outputs.ok()) << outputs.status();
        const std::vector<uint16_t> want = AllReduceReferenceBf16(inputs);
        for (int r = 0; r < world; ++r) ASSERT_EQ((*outputs)[r], want) << "rank " << r;
      }
    }
  }
  // The largest message the kernels take, once (world 2, one-shot).
  const auto inputs = RandomInputs(rng, 2, limits.max_bytes / 2);
  auto outputs = SimulateAllReduceBf16(inputs, PlanAllReduce(limits.max_bytes, 2, true, limits));
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ((*outputs)[1], AllReduceReferenceBf16(inputs));
}

// The checker is not vacuous: segments one pack short leave packs unwritten.
TEST(CustomAllReduceTest, SimulationCatchesABrokenAssignment) {
  std::mt19937 rng(7);
  const ArLaunch good = PlanAllReduce(1 << 20, 4, true, ArLimits());
  ASSERT_EQ(good.path, ArPath::kTwoShot);
  const auto inputs = RandomInputs(rng, 4, (1 << 20) / 2);
  ArLaunch short_segments = good;
  short_segments.segment -= 1;
  auto bad = SimulateAllReduceBf16(inputs, short_segments);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
}

}  // namespace
}  // namespace tandem::comm
