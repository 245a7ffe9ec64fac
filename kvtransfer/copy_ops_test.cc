#include "kvtransfer/copy_ops.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

TEST(ValidateCopyOpsTest, AcceptsRangesInside) {
  const std::vector<uint64_t> local = {100, 50};
  const std::vector<uint64_t> remote = {200};
  const std::vector<CopyOp> ops = {{0, 0, 0, 100, 100}, {1, 49, 0, 199, 1}};
  EXPECT_TRUE(ValidateCopyOps(ops, local, remote).ok());
}

TEST(ValidateCopyOpsTest, Errors) {
  const std::vector<uint64_t> local = {100};
  const std::vector<uint64_t> remote = {100};
  EXPECT_EQ(ValidateCopyOps({}, local, remote).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> zero = {{0, 0, 0, 0, 0}};
  EXPECT_EQ(ValidateCopyOps(zero, local, remote).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> bad_local_region = {{1, 0, 0, 0, 1}};
  EXPECT_EQ(ValidateCopyOps(bad_local_region, local, remote).code(), absl::StatusCode::kOutOfRange);
  const std::vector<CopyOp> bad_remote_region = {{0, 0, 7, 0, 1}};
  absl::Status s = ValidateCopyOps(bad_remote_region, local, remote);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("remote region 7"), absl::string_view::npos) << s;
  const std::vector<CopyOp> past_end = {{0, 0, 0, 1, 100}};
  EXPECT_EQ(ValidateCopyOps(past_end, local, remote).code(), absl::StatusCode::kOutOfRange);
  // offset + length wraps around 2^64: must not pass as "small".
  const std::vector<CopyOp> overflow = {{0, 1, 0, 0, ~uint64_t{0}}};
  EXPECT_EQ(ValidateCopyOps(overflow, local, remote).code(), absl::StatusCode::kOutOfRange);
  const std::vector<CopyOp> huge_offset = {{0, ~uint64_t{0}, 0, 0, 2}};
  EXPECT_EQ(ValidateCopyOps(huge_offset, local, remote).code(), absl::StatusCode::kOutOfRange);
}

TEST(CoalesceCopyOpsTest, MergesOnlyRunsContiguousOnBothSides) {
  const std::vector<CopyOp> ops = {
      {0, 0, 0, 10, 5},   // start
      {0, 5, 0, 15, 5},   // continues both sides -> merged
      {0, 10, 0, 30, 5},  // remote jumps -> new op
      {0, 15, 1, 35, 5},  // remote region differs -> new op
      {1, 20, 1, 40, 5},  // local region differs -> new op
  };
  const std::vector<CopyOp> out = CoalesceCopyOps(ops);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].length, 10u);
  EXPECT_EQ(out[1].remote_offset, 30u);
  EXPECT_EQ(TotalBytes(out), TotalBytes(ops));
}

// Property: coalescing moves the same bytes to the same places (checked by simulating copies).
TEST(CoalesceCopyOpsTest, RandomBlockListsCopySameBytes) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr uint64_t kBlock = 7;  // odd size on purpose
  constexpr uint32_t kBlocks = 40;
  std::vector<uint8_t> src(kBlock * kBlocks);
  for (auto& b : src) b = static_cast<uint8_t>(rng() | 1);
  for (int round = 0; round < 50; ++round) {
    const uint32_t n = 1 + rng() % kBlocks;
    std::vector<uint32_t> remote(kBlocks), local(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) remote[i] = local[i] = i;
    // Mostly-sorted lists so that some runs are contiguous.
    if (rng() % 2) std::shuffle(remote.begin(), remote.end(), rng);
    if (rng() % 3 == 0) std::shuffle(local.begin(), local.end(), rng);
    remote.resize(n);
    local.resize(n);
    std::vector<CopyOp> raw;
    for (uint32_t i = 0; i < n; ++i) {
      raw.push_back({0, local[i] * kBlock, 0, remote[i] * kBlock, kBlock});
    }
    const std::vector<CopyOp> merged = BlockCopyOps(0, 0, kBlock, local, remote);
    EXPECT_LE(merged.size(), raw.size());
    std::vector<uint8_t> a(src.size(), 0), b(src.size(), 0);
    for (const CopyOp& op : raw) {
      std::copy_n(&src[op.remote_offset], op.length, &a[op.local_offset]);
    }
    for (const CopyOp& op : merged) {
      std::copy_n(&src[op.remote_offset], op.length, &b[op.local_offset]);
    }
    EXPECT_EQ(a, b);
  }
}

TEST(BlockCopyOpsTest, ContiguousBlocksBecomeOneOp) {
  const std::vector<uint32_t> local = {4, 5, 6, 9};
  const std::vector<uint32_t> remote = {10, 11, 12, 13};
  const std::vector<CopyOp> ops = BlockCopyOps(1, 2, 100, local, remote);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].local_region, 1u);
  EXPECT_EQ(ops[0].remote_region, 2u);
  EXPECT_EQ(ops[0].local_offset, 400u);
  EXPECT_EQ(ops[0].remote_offset, 1000u);
  EXPECT_EQ(ops[0].length, 300u);
  EXPECT_EQ(ops[1].local_offset, 900u);
  EXPECT_EQ(ops[1].remote_offset, 1300u);
  EXPECT_TRUE(BlockCopyOps(0, 0, 100, local, std::vector<uint32_t>{1}).empty());
}

TEST(StridedCopyOpsTest, ValidateChecksRowsStridesAndTheLastRow) {
  const std::vector<uint64_t> local = {1000}, remote = {4000};
  const StridedCopyOp ok{.local_offset = 10,
                         .local_stride = 100,
                         .remote_offset = 0,
                         .remote_stride = 400,
                         .row_bytes = 90,
                         .rows = 10};  // local rows end at 10 + 900 + 90 = 1000
  EXPECT_TRUE(ValidateStridedCopyOps({ok}, local, remote).ok());
  StridedCopyOp past = ok;
  past.local_offset = 11;
  EXPECT_EQ(ValidateStridedCopyOps({past}, local, remote).code(), absl::StatusCode::kOutOfRange);
  StridedCopyOp overlap = ok;
  overlap.remote_stride = 89;
  EXPECT_EQ(ValidateStridedCopyOps({overlap}, local, remote).code(),
            absl::StatusCode::kInvalidArgument);
  StridedCopyOp empty = ok;
  empty.rows = 0;
  EXPECT_EQ(ValidateStridedCopyOps({empty}, local, remote).code(),
            absl::StatusCode::kInvalidArgument);
  StridedCopyOp overflow = ok;
  overflow.rows = uint64_t{1} << 62;
  EXPECT_EQ(ValidateStridedCopyOps({overflow}, local, remote).code(),
            absl::StatusCode::kOutOfRange);
  StridedCopyOp region = ok;
  region.remote_region = 1;
  EXPECT_EQ(ValidateStridedCopyOps({region}, local, remote).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateStridedCopyOps({}, local, remote).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StridedCopyOpsTest, CoalescesOnlyOpsThatContinueTheRows) {
  const StridedCopyOp a{.local_offset = 0,
                        .local_stride = 64,
                        .remote_offset = 32,
                        .remote_stride = 128,
                        .row_bytes = 32,
                        .rows = 4};
  StridedCopyOp b = a;  // the next 4 rows on both sides
  b.local_offset = 256;
  b.remote_offset = 32 + 512;
  StridedCopyOp c = b;  // continues locally only
  c.local_offset = 512;
  c.remote_offset = 0;
  const std::vector<StridedCopyOp> out = CoalesceStridedCopyOps({a, b, c});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rows, 8u);
  EXPECT_EQ(out[1].local_offset, 512u);
  EXPECT_EQ(TotalBytes(absl::MakeConstSpan(out)), 12u * 32);
  const StridedCopyOp one = AsStrided(CopyOp{.local_offset = 5, .remote_offset = 7, .length = 9});
  EXPECT_EQ(one.rows, 1u);
  EXPECT_EQ(one.row_bytes, 9u);
}

}  // namespace
}  // namespace tandem::kvtransfer
