// GPU test of NcclAgent's gather / scatter copies (nccl_agent_copy.h): random tiles with every
// relative alignment (16 / 8 / 4 / 1-byte paths, heads and tails), large aligned tiles, and
// grids smaller than the tile count, through the kernel (ordinary and streaming loads / stores)
// and the copy engines, all bit-exact against a host copy; and the strided path of a re-shard
// between TP splits (KV head slices: reshard.h StridedHeadOps) through the message plan: the
// source's gather and the reader's scatter of every message on the device, in every copy mode,
// equal to a row-by-row host copy. Needs 1 GPU.
#include "kvtransfer/nccl/nccl_agent_copy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kvtransfer/reshard.h"

namespace tandem::kvtransfer::nccl_copy {
namespace {

TEST(NcclCopyTest, RandomTilesAreBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr uint64_t kBytes = uint64_t{24} << 20;
  std::vector<char> src(kBytes), dst(kBytes);
  for (char& c : src) c = static_cast<char>(rng());
  for (char& c : dst) c = static_cast<char>(rng());
  char* d_src = nullptr;
  char* d_dst = nullptr;
  nccl_plan::CopyTile* d_tiles = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_src), kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_dst), kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, src.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_dst, dst.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int round = 0; round < 12; ++round) {
    const CopyMode mode = static_cast<CopyMode>(round % 3);
    // Destinations: disjoint slots of the destination buffer, in random order; sources anywhere.
    const bool aligned = round < 3;  // rounds 0-2: each mode with 16-byte aligned tiles
    const uint64_t slot = aligned ? (uint64_t{1} << 20) : 4096 + rng() % 300000;
    std::vector<uint64_t> slots(kBytes / slot);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = i * slot;
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(std::min<size_t>(slots.size(), 1 + rng() % 200));
    std::vector<nccl_plan::CopyTile> tiles;
    for (uint64_t at : slots) {
      // Aligned: tiles of up to 1 MiB at 16-byte offsets (the KV block case); else any skew.
      const uint64_t head = aligned ? 16 * (rng() % 4) : rng() % 64;
      const uint64_t n = aligned ? slot - head - 16 * (rng() % 4) : 1 + rng() % (slot - head);
      const uint64_t from = aligned ? 16 * (rng() % ((kBytes - n) / 16)) : rng() % (kBytes - n);
      tiles.push_back({reinterpret_cast<uint64_t>(d_src) + from,
                       reinterpret_cast<uint64_t>(d_dst) + at + head, n});
      std::copy(src.begin() + from, src.begin() + from + n, dst.begin() + at + head);
    }
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_tiles), tiles.size() * sizeof(tiles[0])),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(d_tiles, tiles.data(), tiles.size() * sizeof(tiles[0]), cudaMemcpyHostToDevice),
        cudaSuccess);
    const int ctas = round % 4 == 0 ? 1 : 1 + static_cast<int>(rng() % 200);
    const uint32_t n = static_cast<uint32_t>(tiles.size());
    if (mode == CopyMode::kCopyEngine) {
      ASSERT_EQ(CopyTilesWithEngines(tiles.data(), n, stream), cudaSuccess);
    } else {
      ASSERT_EQ(LaunchCopyTiles(d_tiles, n, ctas, mode == CopyMode::kStreamingKernel, stream),
                cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaFree(d_tiles);
    std::vector<char> got(kBytes);
    ASSERT_EQ(cudaMemcpy(got.data(), d_dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_TRUE(got == dst) << "round " << round << " mode " << static_cast<int>(mode) << " slot "
                            << slot << " ctas " << ctas;
  }
  EXPECT_EQ(LaunchCopyTiles(nullptr, 0, 4, false, stream), cudaSuccess);  // nothing to do
  EXPECT_EQ(LaunchCopyTiles(nullptr, 1, 0, false, stream), cudaErrorInvalidValue);
  EXPECT_EQ(CopyTilesWithEngines(nullptr, 0, stream), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFree(d_src);
  cudaFree(d_dst);
}

// Runs one side's copies of `m` the way NcclLink does: nothing when the message is contiguous at
// `place` (NCCL would use the pool: copied here with one cudaMemcpy), else the tiles of
// AppendTiles through the kernel or the engines.
void CopyMessage(const nccl_plan::Plan& plan, const nccl_plan::Message& m,
                 const std::vector<nccl_plan::OpPlace>& place, char* wire,
                 nccl_plan::Direction direction, CopyMode mode, int ctas, cudaStream_t stream) {
  const bool gather = direction == nccl_plan::Direction::kGather;
  if (std::optional<uint64_t> a = nccl_plan::ContiguousAddress(plan, m, place)) {
    char* pool = reinterpret_cast<char*>(*a);
    ASSERT_EQ(cudaMemcpyAsync(gather ? wire : pool, gather ? pool : wire, m.bytes,
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    return;
  }
  const bool engines = mode == CopyMode::kCopyEngine;
  std::vector<nccl_plan::CopyTile> tiles;
  nccl_plan::AppendTiles(plan, m, place, reinterpret_cast<uint64_t>(wire), direction,
                         engines ? UINT64_MAX : uint64_t{128} << 10, &tiles);
  const uint32_t n = static_cast<uint32_t>(tiles.size());
  if (engines) {
    ASSERT_EQ(CopyTilesWithEngines(tiles.data(), n, stream), cudaSuccess);
    return;
  }
  nccl_plan::CopyTile* d_tiles = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_tiles), n * sizeof(tiles[0])), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_tiles, tiles.data(), n * sizeof(tiles[0]), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(LaunchCopyTiles(d_tiles, n, ctas, mode == CopyMode::kStreamingKernel, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(d_tiles);
}

TEST(NcclCopyTest, StridedReshardThroughThePlanIsBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int round = 0; round < 12; ++round) {
    const CopyMode mode = static_cast<CopyMode>(round % 3);
    // 8 KV heads (head_dim x dtype bytes each); P TP a -> D TP b with a != b in {1, 2, 4}.
    // Rows of 16-byte multiples take the kernel's flat path; 36 / 100-byte heads the per-warp one.
    const int64_t head_sizes[] = {64, 128, 256, 36, 100};
    const int64_t head_bytes = head_sizes[rng() % 5];
    const int tps[] = {1, 2, 4};
    const int a = tps[rng() % 3];
    int b = tps[rng() % 3];
    if (b == a) b = a == 4 ? 1 : a * 2;
    const BlockShape src_shape{2 + static_cast<int64_t>(rng() % 3), 16, 8 / a, head_bytes};
    const BlockShape dst_shape{src_shape.num_layers, 16, 8 / b, head_bytes};
    // The destination rank's heads and the source rank that holds (some of) them.
    const int dst_rank = static_cast<int>(rng() % b);
    const int head_count = std::min(8 / a, 8 / b);
    const int global_head =
        dst_rank * (8 / b) +
        (a < b ? 0 : static_cast<int>(rng() % (8 / b / head_count)) * head_count);
    const int src_local = global_head % (8 / a);
    const int dst_local = global_head % (8 / b);
    const int64_t blocks = 48;
    const uint64_t src_bytes = src_shape.BlockBytes() * blocks;
    const uint64_t dst_bytes = dst_shape.BlockBytes() * blocks;
    std::vector<char> src(src_bytes), dst(dst_bytes);
    for (char& c : src) c = static_cast<char>(rng());
    for (char& c : dst) c = static_cast<char>(rng());
    // Random block pairs, some runs consecutive on both sides (coalesced into one op).
    std::vector<int32_t> from(blocks), to(blocks);
    for (int32_t i = 0; i < blocks; ++i) from[i] = to[i] = i;
    if (rng() % 2) std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<std::pair<int32_t, int32_t>> pairs;
    for (size_t i = 0; i < 1 + rng() % blocks; ++i) pairs.push_back({from[i], to[i]});
    const std::vector<StridedCopyOp> ops =
        StridedHeadOps(pairs, src_shape, src_local, dst_shape, dst_local, head_count, 0, 0);
    std::vector<char> expected = dst;
    for (const StridedCopyOp& op : ops) {
      for (uint64_t r = 0; r < op.rows; ++r) {
        std::copy_n(src.begin() + op.remote_offset + r * op.remote_stride, op.row_bytes,
                    expected.begin() + op.local_offset + r * op.local_stride);
      }
    }
    char* d_src = nullptr;
    char* d_dst = nullptr;
    char* d_wire = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_src), src_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_dst), dst_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_src, src.data(), src_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_dst, dst.data(), dst_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<nccl_plan::OpShape> shapes;
    std::vector<nccl_plan::OpPlace> src_place, dst_place;
    for (const StridedCopyOp& op : ops) {
      shapes.push_back({op.row_bytes, op.rows});
      src_place.push_back({reinterpret_cast<uint64_t>(d_src) + op.remote_offset, op.remote_stride});
      dst_place.push_back({reinterpret_cast<uint64_t>(d_dst) + op.local_offset, op.local_stride});
    }
    // Chunks that cut rows (not a multiple of the row) and chunks of many blocks.
    const uint64_t chunk = rng() % 2 ? 1000 + rng() % 50000 : uint64_t{1} << (18 + rng() % 4);
    absl::StatusOr<nccl_plan::Plan> plan = nccl_plan::MakePlan(shapes, {chunk, uint64_t{1} << 20});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_wire), plan->max_packed_bytes + chunk),
              cudaSuccess);
    const int ctas = 1 + static_cast<int>(rng() % 64);
    for (const nccl_plan::Message& m : plan->messages) {
      ASSERT_FALSE(m.direct);
      CopyMessage(*plan, m, src_place, d_wire, nccl_plan::Direction::kGather, mode, ctas, stream);
      CopyMessage(*plan, m, dst_place, d_wire, nccl_plan::Direction::kScatter, mode, ctas, stream);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<char> got(dst_bytes);
    ASSERT_EQ(cudaMemcpy(got.data(), d_dst, dst_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_TRUE(got == expected) << "round " << round << " mode " << static_cast<int>(mode)
                                 << " P tp " << a << " -> D tp " << b << " rank " << dst_rank
                                 << " head_bytes " << head_bytes << " chunk " << chunk;
    cudaFree(d_src);
    cudaFree(d_dst);
    cudaFree(d_wire);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl_copy
