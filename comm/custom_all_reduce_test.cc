// The custom all-reduce's host side (no GPU): the path/size rules, and the kernels' pack
// assignment played on the host (custom_all_reduce_reference.h) against the rank-order fp32
// reference on random bf16 inputs, for world 2/4/8 and sizes from 16 B to 8 MiB.
#include <cmath>
#include <random>
#include <vector>

#include "comm/custom_all_reduce_layout.h"
#include "comm/custom_all_reduce_reference.h"
#include "gtest/gtest.h"
#include "kernels/layers/norm.h"

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

TEST(CustomAllReduceTest, FusedNormPathsAndShapes) {
  const ArLimits limits;
  // Fused exactly where the plain all-reduce is one-shot, for 16-bit rows of whole packs.
  // Decode: a row over a cluster of 8 blocks of 32 threads, 2 (8B) / 4 (70B) packs a thread.
  const ArNormLaunch decode = PlanAllReduceNorm(1, 4096, 2, 2, true, limits);
  EXPECT_TRUE(decode.fused);
  EXPECT_EQ(decode.row_packs, 512);
  EXPECT_EQ(decode.row_blocks, 8);
  EXPECT_EQ(decode.threads, 32);
  EXPECT_EQ(decode.groups, 1);
  EXPECT_EQ(decode.blocks, 8);
  EXPECT_EQ(decode.vecs, 2);
  EXPECT_EQ(PlanAllReduceNorm(1, 8192, 2, 4, true, limits).vecs, 4);
  // Fewer blocks per row as rows grow (rows x row_blocks <= kArMaxBlocks), one block of 256
  // threads per row from 19 rows, at most kArMaxBlocks groups.
  EXPECT_EQ(PlanAllReduceNorm(4, 4096, 2, 4, true, limits).blocks, 32);
  EXPECT_EQ(PlanAllReduceNorm(5, 4096, 2, 4, true, limits).row_blocks, 4);
  EXPECT_EQ(PlanAllReduceNorm(9, 4096, 2, 4, true, limits).blocks, 36);
  EXPECT_EQ(PlanAllReduceNorm(10, 4096, 2, 4, true, limits).row_blocks, 2);
  const ArNormLaunch many = PlanAllReduceNorm(64, 8192, 2, 2, true, limits);
  EXPECT_EQ(many.row_blocks, 1);
  EXPECT_EQ(many.threads, kArNormThreads);
  EXPECT_EQ(many.blocks, kArMaxBlocks);
  EXPECT_EQ(PlanAllReduceNorm(7, 8192, 2, 4, true, limits).blocks, 28);
  // Narrow rows: no block of a cluster without packs (64 values: 8 packs, one block).
  EXPECT_EQ(PlanAllReduceNorm(1, 64, 2, 2, true, limits).row_blocks, 1);
  EXPECT_EQ(PlanAllReduceNorm(1, 1536, 2, 2, true, limits).row_blocks, 2);  // 192 packs
  EXPECT_EQ(PlanAllReduceNorm(1, 2048, 2, 2, true, limits).row_blocks, 8);
  // Up to 8 packs a thread (16384 values); wider rows are not fused.
  EXPECT_EQ(PlanAllReduceNorm(1, 16384, 2, 2, true, limits).vecs, 8);
  EXPECT_EQ(PlanAllReduceNorm(1, 12288, 2, 2, true, limits).vecs, 8);
  EXPECT_FALSE(PlanAllReduceNorm(1, 16384 + 8, 2, 2, true, limits).fused);
  EXPECT_TRUE(PlanAllReduceNorm(512, 8192, 2, 2, true, limits).fused);   // 8 MiB, world 2
  EXPECT_FALSE(PlanAllReduceNorm(513, 8192, 2, 2, true, limits).fused);  // past the limit
  EXPECT_TRUE(PlanAllReduceNorm(31, 8192, 2, 4, true, limits).fused);    // 496 KiB: one-shot
  EXPECT_FALSE(PlanAllReduceNorm(32, 8192, 2, 4, true, limits).fused);   // 512 KiB: two-shot
  EXPECT_FALSE(PlanAllReduceNorm(16, 8192, 2, 8, true, limits).fused);   // 256 KiB: two-shot
  EXPECT_FALSE(PlanAllReduceNorm(1, 4096, 4, 2, true, limits).fused);    // fp32
  EXPECT_FALSE(PlanAllReduceNorm(1, 4100, 2, 2, true, limits).fused);    // not whole packs
  EXPECT_FALSE(PlanAllReduceNorm(1, 4096, 2, 3, true, limits).fused);    // world 3
  EXPECT_FALSE(PlanAllReduceNorm(1, 4096, 2, 2, false, limits).fused);   // no IPC buffers
  EXPECT_FALSE(PlanAllReduceNorm(0, 4096, 2, 2, true, limits).fused);
}

std::vector<uint16_t> RandomBf16(std::mt19937& rng, int64_t n, float mean, float stddev) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = ArFloatToBf16(normal(rng));
  return v;
}

// The fused kernel's pack assignment played on the host gives every rank the reference, bit for
// bit, with and without the residual add, for every blocks-per-row regime (8, 4, 2, 1), odd row
// counts below, at and above the block count, and rows not a multiple of the threads' packs.
TEST(CustomAllReduceTest, SimulatedFusedKernelEqualsTheReference) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  for (int world : {2, 4, 8}) {
    for (int64_t rows : {1, 3, 5, 10, 19, 36, 37, 75}) {
      for (int64_t hidden : {64, 1000, 4096, 8192}) {
        const ArNormLaunch launch = PlanAllReduceNorm(rows, hidden, 2, world, true, ArLimits());
        if (!launch.fused) continue;  // two-shot sizes at world 4 / 8
        for (bool add : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "world " << world << " rows " << rows << " hidden "
                                            << hidden << " add " << add);
          const auto inputs = RandomInputs(rng, world, rows * hidden);
          const auto residual = RandomBf16(rng, rows * hidden, 0.0f, 2.0f);
          const auto weight = RandomBf16(rng, hidden, 1.0f, 0.1f);
          auto got =
              SimulateAllReduceAddRmsNormBf16(inputs, residual, weight, launch, hidden, 1e-5f, add);
          ASSERT_TRUE(got.ok()) << got.status();
          const AddRmsNormBf16 want =
              AllReduceAddRmsNormReferenceBf16(inputs, residual, weight, hidden, 1e-5f, add);
          for (int r = 0; r < world; ++r) {
            ASSERT_EQ((*got)[r].residual, want.residual) << "rank " << r;
            ASSERT_EQ((*got)[r].out, want.out) << "rank " << r;
          }
        }
      }
    }
  }
  // Inputs that do not match the launch are refused.
  const ArNormLaunch launch = PlanAllReduceNorm(2, 64, 2, 2, true, ArLimits());
  const auto inputs = RandomInputs(rng, 2, 2 * 64);
  EXPECT_EQ(SimulateAllReduceAddRmsNormBf16(inputs, std::vector<uint16_t>(128), {}, launch, 64,
                                            1e-5f, true)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The checker is not vacuous: one pack a thread leaves the second half of every row unwritten.
  ArNormLaunch one_pack = PlanAllReduceNorm(5, 4096, 2, 4, true, ArLimits());
  ASSERT_EQ(one_pack.vecs, 2);
  one_pack.vecs = 1;
  const auto wide = RandomInputs(rng, 4, 5 * 4096);
  auto bad = SimulateAllReduceAddRmsNormBf16(wide, RandomBf16(rng, 5 * 4096, 0.0f, 1.0f),
                                             RandomBf16(rng, 4096, 1.0f, 0.1f), one_pack, 4096,
                                             1e-5f, true);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
}

// The reference is the model's CPU op: cpu::FusedAddRmsNorm (fp32, fp64 mean) on the all-reduced
// sum gives the same residual (before bf16 rounding) and the same output within bf16's precision.
TEST(CustomAllReduceTest, FusedReferenceIsTheCpuAddRmsNorm) {
  std::mt19937 rng(5);
  const int64_t rows = 9, hidden = 4096;
  const auto inputs = RandomInputs(rng, 4, rows * hidden);
  const auto residual = RandomBf16(rng, rows * hidden, 0.0f, 3.0f);
  const auto weight = RandomBf16(rng, hidden, 1.0f, 0.2f);
  const float eps = 1e-5f;
  for (bool add : {true, false}) {
    const AddRmsNormBf16 got =
        AllReduceAddRmsNormReferenceBf16(inputs, residual, weight, hidden, eps, add);
    const std::vector<uint16_t> sum = AllReduceReferenceBf16(inputs);
    std::vector<float> x(sum.size()), res(sum.size()), w(hidden);
    for (size_t i = 0; i < sum.size(); ++i) {
      x[i] = ArBf16ToFloat(sum[i]);
      res[i] = add ? ArBf16ToFloat(residual[i]) : 0.0f;
    }
    for (int64_t i = 0; i < hidden; ++i) w[i] = ArBf16ToFloat(weight[i]);
    kernels::cpu::FusedAddRmsNorm(x.data(), res.data(), w.data(), rows, hidden, eps);
    int64_t off = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      ASSERT_EQ(got.residual[i], ArFloatToBf16(res[i])) << i;
      const float g = ArBf16ToFloat(got.out[i]);
      off += std::fabs(g - x[i]) > 1.0f / 64 * std::fabs(x[i]) + 1e-3f;
    }
    EXPECT_EQ(off, 0) << "add " << add;
  }
}

}  // namespace
}  // namespace tandem::comm
