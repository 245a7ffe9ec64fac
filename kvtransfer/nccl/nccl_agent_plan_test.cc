// CPU tests of NcclAgent's message plan (nccl_agent_plan.h): the plan's invariants on random op
// lists, and a host simulation of the whole staging path (gather on one side, the message, the
// scatter on the other) that must move every byte where a plain per-op copy would.
#include "kvtransfer/nccl/nccl_agent_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer::nccl_plan {
namespace {

uint64_t Addr(const char* p) { return reinterpret_cast<uint64_t>(p); }

TEST(NcclPlanTest, RejectsBadInput) {
  EXPECT_EQ(MakePlan({}, {64, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan({{8, 0}}, {64, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan({{8}}, {0, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan({{8}}, {64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclPlanTest, PacksSmallOpsAndSendsLargeOnesAlone) {
  // chunk 10, direct >= 8: ops 3,4 packed, 9 alone, 5,6 packed across a chunk boundary.
  absl::StatusOr<Plan> plan = MakePlan({{3, 4, 9, 5, 6}}, {10, 8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint64_t> sizes;
  for (const Message& m : plan->messages) sizes.push_back(m.bytes);
  EXPECT_EQ(sizes, (std::vector<uint64_t>{7, 9, 10, 1}));
  EXPECT_EQ(plan->messages[1].num_pieces, 1u);
  EXPECT_TRUE(plan->messages[1].direct);
  EXPECT_FALSE(plan->messages[0].direct);
  EXPECT_EQ(plan->pieces[plan->messages[1].first_piece].op, 2u);
  // Op 4 (6 bytes) straddles: 5 bytes in message 2, 1 byte in message 3.
  const Piece& last = plan->pieces[plan->messages[3].first_piece];
  EXPECT_EQ(last.op, 4u);
  EXPECT_EQ(last.op_offset, 5u);
  EXPECT_EQ(last.bytes, 1u);
  EXPECT_EQ(plan->max_packed_bytes, 10u);
}

TEST(NcclPlanTest, ContiguousAddressNeedsAdjacentPieces) {
  absl::StatusOr<Plan> plan = MakePlan({{4, 4, 4}}, {64, 64});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->messages.size(), 1u);
  const Message& m = plan->messages[0];
  EXPECT_EQ(ContiguousAddress(*plan, m, {{100, 104, 108}}), std::optional<uint64_t>(100));
  EXPECT_EQ(ContiguousAddress(*plan, m, {{100, 104, 200}}), std::nullopt);
  EXPECT_EQ(ContiguousAddress(*plan, m, {{104, 100, 108}}), std::nullopt);
}

// Random op lists: the pieces cover each op exactly once, in stream order; packed messages are
// full chunks except the last before a direct op or the end; direct ops travel alone.
TEST(NcclPlanTest, RandomPlansCoverTheStreamInOrder) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const PlanParams params{1 + rng() % 5000, 1 + rng() % 8000};
    std::vector<uint64_t> ops(1 + rng() % 60);
    for (uint64_t& len : ops) len = 1 + rng() % (rng() % 4 == 0 ? 20000 : 3000);
    absl::StatusOr<Plan> plan = MakePlan(ops, params);
    ASSERT_TRUE(plan.ok()) << plan.status();
    uint32_t op = 0;
    uint64_t offset = 0;
    uint64_t max_packed = 0;
    for (size_t i = 0; i < plan->messages.size(); ++i) {
      const Message& m = plan->messages[i];
      ASSERT_GT(m.num_pieces, 0u);
      uint64_t sum = 0;
      for (uint32_t k = 0; k < m.num_pieces; ++k) {
        const Piece& p = plan->pieces[m.first_piece + k];
        if (offset == ops[op]) {
          ++op;
          offset = 0;
        }
        ASSERT_EQ(p.op, op) << "message " << i;
        ASSERT_EQ(p.op_offset, offset);
        ASSERT_GT(p.bytes, 0u);
        offset += p.bytes;
        ASSERT_LE(offset, ops[op]);
        sum += p.bytes;
      }
      EXPECT_EQ(sum, m.bytes);
      const Piece& first = plan->pieces[m.first_piece];
      EXPECT_EQ(m.direct, ops[first.op] >= params.direct_min_bytes) << "message " << i;
      if (ops[first.op] >= params.direct_min_bytes) {
        EXPECT_EQ(m.num_pieces, 1u);
        EXPECT_EQ(m.bytes, ops[first.op]);
      } else {
        EXPECT_LE(m.bytes, params.chunk_bytes);
        const bool last_of_run =
            i + 1 == plan->messages.size() ||
            ops[plan->pieces[plan->messages[i + 1].first_piece].op] >= params.direct_min_bytes;
        if (!last_of_run) {
          EXPECT_EQ(m.bytes, params.chunk_bytes) << "message " << i;
        }
        if (m.num_pieces > 1) max_packed = std::max(max_packed, m.bytes);
      }
    }
    EXPECT_EQ(op + 1, ops.size());
    EXPECT_EQ(offset, ops.back());
    EXPECT_EQ(plan->max_packed_bytes, max_packed);
    EXPECT_EQ(plan->pieces.back().op + 1, ops.size());
  }
}

// Simulates both sides on the host: random (source block, reader block) lists over two pools,
// each message gathered (unless contiguous on the source), carried, scattered (unless
// contiguous on the reader). The reader pool must equal a plain per-op copy.
TEST(NcclPlanTest, HostSimulatedStagingMovesEveryByteLikeAPlainCopy) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 50; ++round) {
    const uint64_t block = 1 + rng() % 300;
    const uint32_t blocks = 8 + rng() % 64;
    std::vector<char> src(block * blocks), dst(block * blocks), expected;
    for (char& c : src) c = static_cast<char>(rng());
    for (char& c : dst) c = static_cast<char>(rng());
    expected = dst;
    std::vector<uint32_t> from(blocks), to(blocks);
    std::iota(from.begin(), from.end(), 0);
    std::iota(to.begin(), to.end(), 0);
    std::shuffle(from.begin(), from.end(), rng);
    if (rng() % 2) std::shuffle(to.begin(), to.end(), rng);  // else: contiguous on the reader
    const size_t n = 1 + rng() % blocks;
    std::vector<uint64_t> lengths, src_addr, dst_addr;
    for (size_t i = 0; i < n; ++i) {
      // Occasionally a partial block, so op lengths differ.
      const uint64_t len = rng() % 5 == 0 ? 1 + rng() % block : block;
      lengths.push_back(len);
      src_addr.push_back(Addr(src.data()) + from[i] * block);
      dst_addr.push_back(Addr(dst.data()) + to[i] * block);
      std::memcpy(expected.data() + to[i] * block, src.data() + from[i] * block, len);
    }
    const PlanParams params{1 + rng() % (3 * block), 1 + rng() % (4 * block)};
    absl::StatusOr<Plan> plan = MakePlan(lengths, params);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const uint64_t tile = 1 + rng() % 97;
    std::vector<char> wire, staging;
    for (const Message& m : plan->messages) {
      wire.assign(m.bytes, 0);
      std::vector<CopyTile> tiles;
      if (auto a = ContiguousAddress(*plan, m, src_addr)) {
        std::memcpy(wire.data(), reinterpret_cast<const char*>(*a), m.bytes);
      } else {
        ASSERT_LE(m.bytes, plan->max_packed_bytes);
        staging.assign(m.bytes, 0);
        AppendTiles(*plan, m, src_addr, Addr(staging.data()), Direction::kGather, tile, &tiles);
        for (const CopyTile& t : tiles) {
          ASSERT_LE(t.bytes, tile);
          std::memcpy(reinterpret_cast<char*>(t.dst), reinterpret_cast<const char*>(t.src),
                      t.bytes);
        }
        wire = staging;
      }
      if (auto a = ContiguousAddress(*plan, m, dst_addr)) {
        std::memcpy(reinterpret_cast<char*>(*a), wire.data(), m.bytes);
      } else {
        tiles.clear();
        AppendTiles(*plan, m, dst_addr, Addr(wire.data()), Direction::kScatter, tile, &tiles);
        for (const CopyTile& t : tiles) {
          std::memcpy(reinterpret_cast<char*>(t.dst), reinterpret_cast<const char*>(t.src),
                      t.bytes);
        }
      }
    }
    ASSERT_TRUE(dst == expected) << "round " << round << " block " << block;
  }
}

TEST(LoneTransferChunkTest, AnEighthWithinBounds) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint64_t max = 128 * kMiB, min = 32 * kMiB;
  EXPECT_EQ(LoneTransferChunk(2 * kMiB, max, min), min);    // small: the floor
  EXPECT_EQ(LoneTransferChunk(128 * kMiB, max, min), min);  // 16 MiB -> 32
  EXPECT_EQ(LoneTransferChunk(512 * kMiB, max, min), 64 * kMiB);
  EXPECT_EQ(LoneTransferChunk(2048 * kMiB, max, min), max);           // 256 MiB -> 128
  EXPECT_EQ(LoneTransferChunk(300 * kMiB + 5, max, min), 38 * kMiB);  // 37.5 MiB, rounded up
  EXPECT_EQ(LoneTransferChunk(512 * kMiB, max, 0), max);              // off
  EXPECT_EQ(LoneTransferChunk(2 * kMiB, 16 * kMiB, min), 16 * kMiB);  // floor above the ceiling
  // Random sizes: always a whole number of MiB (or the ceiling) within the bounds, monotone.
  std::mt19937_64 rng(std::random_device{}());
  uint64_t prev_chunk = 0;
  std::vector<uint64_t> sizes(200);
  for (uint64_t& s : sizes) s = 1 + rng() % (4096 * kMiB);
  std::sort(sizes.begin(), sizes.end());
  for (uint64_t s : sizes) {
    const uint64_t c = LoneTransferChunk(s, max, min);
    EXPECT_GE(c, min);
    EXPECT_LE(c, max);
    EXPECT_EQ(c % kMiB, 0u);
    EXPECT_GE(c * 8, std::min(s, 8 * max)) << s;
    EXPECT_GE(c, prev_chunk) << s;  // sizes ascend
    prev_chunk = c;
  }
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl_plan
