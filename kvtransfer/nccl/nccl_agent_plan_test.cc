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

#include "absl/types/span.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer::nccl_plan {
namespace {

uint64_t Addr(const char* p) { return reinterpret_cast<uint64_t>(p); }

// Contiguous ops of these lengths (one row each).
std::vector<OpShape> Rows(std::vector<uint64_t> lengths) {
  std::vector<OpShape> out;
  for (uint64_t len : lengths) out.push_back({len, 1});
  return out;
}

// Contiguous ops at these addresses.
std::vector<OpPlace> At(std::vector<uint64_t> addrs) {
  std::vector<OpPlace> out;
  for (uint64_t a : addrs) out.push_back({a, 0});
  return out;
}

// What the copy kernel does, on the host.
void RunTiles(absl::Span<const CopyTile> tiles) {
  for (const CopyTile& t : tiles) {
    for (uint64_t r = 0; r < t.rows; ++r) {
      std::memcpy(reinterpret_cast<char*>(t.dst + r * t.dst_pitch),
                  reinterpret_cast<const char*>(t.src + r * t.src_pitch), t.bytes);
    }
  }
}

TEST(NcclPlanTest, RejectsBadInput) {
  EXPECT_EQ(MakePlan(Rows({}), {64, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(Rows({8, 0}), {64, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(Rows({8}), {0, 64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(Rows({8}), {64, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclPlanTest, PacksSmallOpsAndSendsLargeOnesAlone) {
  // chunk 10, direct >= 8: ops 3,4 packed, 9 alone, 5,6 packed across a chunk boundary.
  absl::StatusOr<Plan> plan = MakePlan(Rows({3, 4, 9, 5, 6}), {10, 8});
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
  absl::StatusOr<Plan> plan = MakePlan(Rows({4, 4, 4}), {64, 64});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->messages.size(), 1u);
  const Message& m = plan->messages[0];
  EXPECT_EQ(ContiguousAddress(*plan, m, At({100, 104, 108})), std::optional<uint64_t>(100));
  EXPECT_EQ(ContiguousAddress(*plan, m, At({100, 104, 200})), std::nullopt);
  EXPECT_EQ(ContiguousAddress(*plan, m, At({104, 100, 108})), std::nullopt);
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
    absl::StatusOr<Plan> plan = MakePlan(Rows(ops), params);
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
    absl::StatusOr<Plan> plan = MakePlan(Rows(lengths), params);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const uint64_t tile = 1 + rng() % 97;
    std::vector<char> wire, staging;
    for (const Message& m : plan->messages) {
      wire.assign(m.bytes, 0);
      std::vector<CopyTile> tiles;
      if (auto a = ContiguousAddress(*plan, m, At(src_addr))) {
        std::memcpy(wire.data(), reinterpret_cast<const char*>(*a), m.bytes);
      } else {
        ASSERT_LE(m.bytes, plan->max_packed_bytes);
        staging.assign(m.bytes, 0);
        AppendTiles(*plan, m, At(src_addr), Addr(staging.data()), Direction::kGather, tile, &tiles);
        for (const CopyTile& t : tiles) {
          ASSERT_LE(t.bytes, tile);
          ASSERT_EQ(t.rows, 1u);
        }
        RunTiles(tiles);
        wire = staging;
      }
      if (auto a = ContiguousAddress(*plan, m, At(dst_addr))) {
        std::memcpy(reinterpret_cast<char*>(*a), wire.data(), m.bytes);
      } else {
        tiles.clear();
        AppendTiles(*plan, m, At(dst_addr), Addr(wire.data()), Direction::kScatter, tile, &tiles);
        RunTiles(tiles);
      }
    }
    ASSERT_TRUE(dst == expected) << "round " << round << " block " << block;
  }
}

TEST(NcclPlanTest, StridedOpsArePackedAndCutRowsStayContiguousWithinARow) {
  // Op 0: 4 rows of 8 bytes (32 >= direct_min, but strided ops never travel direct); op 1: one
  // row of 40 bytes (direct). Chunk 12: op 0 is cut at 12 and 24, inside rows 1 and 3.
  absl::StatusOr<Plan> plan = MakePlan(std::vector<OpShape>{{8, 4}, {40, 1}}, {12, 32});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint64_t> sizes;
  for (const Message& m : plan->messages) sizes.push_back(m.bytes);
  EXPECT_EQ(sizes, (std::vector<uint64_t>{12, 12, 8, 40}));
  EXPECT_FALSE(plan->messages[0].direct);
  EXPECT_TRUE(plan->messages[3].direct);
  // Rows 16 bytes apart: message 0 = row 0 + half of row 1: not contiguous; message 2 = the
  // last 8 bytes (half of row 2 + ... no: bytes 24..32 = row 3) lies inside one row.
  const std::vector<OpPlace> strided = {{1000, 16}, {5000, 0}};
  EXPECT_EQ(ContiguousAddress(*plan, plan->messages[0], strided), std::nullopt);
  EXPECT_EQ(ContiguousAddress(*plan, plan->messages[2], strided), std::optional<uint64_t>(1048));
  // Rows back to back: the op is contiguous at that place.
  const std::vector<OpPlace> packed = {{1000, 8}, {5000, 0}};
  EXPECT_EQ(ContiguousAddress(*plan, plan->messages[1], packed), std::optional<uint64_t>(1012));
  // Message 1 (bytes 12..24: the end of row 1, all of row 2) gathers as 2 tiles.
  std::vector<CopyTile> tiles;
  AppendTiles(*plan, plan->messages[1], strided, 0, Direction::kGather, 64, &tiles);
  ASSERT_EQ(tiles.size(), 2u);
  EXPECT_EQ(tiles[0].src, 1000u + 16 + 4);
  EXPECT_EQ(tiles[0].bytes, 4u);
  EXPECT_EQ(tiles[1].src, 1000u + 32);
  EXPECT_EQ(tiles[1].dst, 4u);
  EXPECT_EQ(tiles[1].bytes, 8u);
  EXPECT_EQ(MakePlan(std::vector<OpShape>{{8, 0}}, {12, 32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(std::vector<OpShape>{{0, 3}}, {12, 32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(std::vector<OpShape>{{uint64_t{1} << 40, uint64_t{1} << 30}}, {12, 32})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // 2^70 bytes
}

// Strided ops (a head slice of KV blocks between TP splits: rows with gaps on one side or both)
// mixed with contiguous ones, simulated on both sides as above: the reader pool must equal a
// row-by-row copy, tiles of rows stay within the tile budget, nothing outside the rows changes.
TEST(NcclPlanTest, HostSimulatedStridedStagingMovesEveryRowLikeARowCopy) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 100; ++round) {
    const size_t num_ops = 1 + rng() % 12;
    std::vector<OpShape> shapes;
    std::vector<OpPlace> src_place, dst_place;
    std::vector<char> src(1 << 16), dst;
    for (char& c : src) c = static_cast<char>(rng());
    struct Layout {
      uint64_t src_off, src_stride, dst_off, dst_stride;
    };
    std::vector<Layout> layouts;
    uint64_t dst_end = 0;
    for (size_t i = 0; i < num_ops; ++i) {
      OpShape shape{1 + rng() % 96, rng() % 4 == 0 ? 1 : 1 + rng() % 24};
      auto stride = [&] { return shape.row_bytes + (rng() % 3 == 0 ? 0 : rng() % 200); };
      Layout l{0, stride(), dst_end + rng() % 32, stride()};
      const uint64_t src_span = (shape.rows - 1) * l.src_stride + shape.row_bytes;
      l.src_off = rng() % (src.size() - src_span);
      dst_end = l.dst_off + (shape.rows - 1) * l.dst_stride + shape.row_bytes;
      shapes.push_back(shape);
      layouts.push_back(l);
    }
    dst.resize(dst_end);
    for (char& c : dst) c = static_cast<char>(rng());
    std::vector<char> expected = dst;
    for (size_t i = 0; i < num_ops; ++i) {
      const Layout& l = layouts[i];
      src_place.push_back({Addr(src.data()) + l.src_off, l.src_stride});
      dst_place.push_back({Addr(dst.data()) + l.dst_off, l.dst_stride});
      for (uint64_t r = 0; r < shapes[i].rows; ++r) {
        std::memcpy(expected.data() + l.dst_off + r * l.dst_stride,
                    src.data() + l.src_off + r * l.src_stride, shapes[i].row_bytes);
      }
    }
    const PlanParams params{1 + rng() % 700, 1 + rng() % 400};
    absl::StatusOr<Plan> plan = MakePlan(shapes, params);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const uint64_t tile = rng() % 3 == 0 ? UINT64_MAX : 1 + rng() % 300;  // engines: no limit
    std::vector<char> wire;
    for (const Message& m : plan->messages) {
      const Piece& first = plan->pieces[m.first_piece];
      if (m.direct) {
        EXPECT_EQ(m.num_pieces, 1u);
        EXPECT_EQ(shapes[first.op].rows, 1u) << "strided ops never travel direct";
      }
      wire.assign(m.bytes, 0);
      std::vector<CopyTile> tiles;
      if (auto a = ContiguousAddress(*plan, m, src_place)) {
        std::memcpy(wire.data(), reinterpret_cast<const char*>(*a), m.bytes);
      } else {
        AppendTiles(*plan, m, src_place, Addr(wire.data()), Direction::kGather, tile, &tiles);
        uint64_t moved = 0;
        for (const CopyTile& t : tiles) {
          ASSERT_GE(t.rows, 1u);
          ASSERT_LE(t.rows * t.bytes, tile) << t.rows << " rows of " << t.bytes;
          moved += t.rows * t.bytes;
        }
        ASSERT_EQ(moved, m.bytes);
        RunTiles(tiles);
      }
      if (auto a = ContiguousAddress(*plan, m, dst_place)) {
        std::memcpy(reinterpret_cast<char*>(*a), wire.data(), m.bytes);
      } else {
        tiles.clear();
        AppendTiles(*plan, m, dst_place, Addr(wire.data()), Direction::kScatter, tile, &tiles);
        RunTiles(tiles);
      }
    }
    ASSERT_TRUE(dst == expected) << "round " << round;
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
