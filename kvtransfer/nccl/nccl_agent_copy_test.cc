// GPU test of NcclAgent's gather / scatter copies (nccl_agent_copy.h): random tiles with every
// relative alignment (16 / 8 / 4 / 1-byte paths, heads and tails), large aligned tiles, and
// grids smaller than the tile count, through the kernel (ordinary and streaming loads / stores)
// and the copy engines, all bit-exact against a host copy. Needs 1 GPU.
#include "kvtransfer/nccl/nccl_agent_copy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace tandem::kvtransfer::nccl_copy
