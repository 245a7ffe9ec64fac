// Internal to kernels/moe: the device pieces MoeGroupedMma (moe_grouped_mma_cuda.cu) and
// MoeFp8GroupedMma (moe_fp8_grouped_mma_cuda.cu) share: 128-byte shared tile rows with the 16-byte
// chunk XOR-swizzled by (row & 7) (conflict-free ldmatrix), a zero-filling 16-byte cp.async, and
// the m-tile -> expert search over the device offsets.
#ifndef TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_
#define TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_

#include <cstdint>

namespace tandem::kernels::cuda::moe_tile {

inline constexpr int kRowBytes = 128;  // one shared tile row

// Byte offset of 16-byte chunk `chunk` (0..7) of tile row `row`.
__device__ __forceinline__ uint32_t Swz(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// Warp 0 finds m-tile `mt`'s expert: tile[0] = expert (-1: none), tile[1] = its first row,
// tile[2] = the expert's end row. Experts are scanned 32 at a time (inclusive warp scan of
// ceil(count / bm)).
__device__ inline void FindTile(const int32_t* __restrict__ offsets, int num_experts, int mt,
                                int bm, int* tile) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  if (lane == 0) tile[0] = -1;
  __syncwarp();
  int before = 0;  // tiles of the experts below this chunk
  for (int e0 = 0; e0 < num_experts; e0 += 32) {
    const int e = e0 + lane;
    int begin = 0, count = 0;
    if (e < num_experts) {
      begin = offsets[e];
      count = offsets[e + 1] - begin;
    }
    const int tiles = (count + bm - 1) / bm;
    int incl = tiles;
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    const int first = before + incl - tiles;
    const bool mine = tiles > 0 && mt >= first && mt < first + tiles;
    if (mine) {
      tile[0] = e;
      tile[1] = begin + (mt - first) * bm;
      tile[2] = begin + count;
    }
    if (__ballot_sync(0xffffffffu, mine) != 0u) break;
    before += __shfl_sync(0xffffffffu, incl, 31);
    if (before > mt) break;
  }
}

}  // namespace tandem::kernels::cuda::moe_tile

#endif  // TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_
