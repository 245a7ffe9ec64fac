// Internal to kernels/moe: the device pieces MoeGroupedMma (moe_grouped_mma_cuda.cu) and
// MoeFp8GroupedMma (moe_fp8_grouped_mma_cuda.cu) share: 128-byte shared tile rows with the 16-byte
// chunk XOR-swizzled by (row & 7) (conflict-free ldmatrix), a zero-filling 16-byte cp.async, the
// m-tile -> expert search over the device offsets, the operand rows one thread copies, the
// cp.async stage load and the ring's prologue, the ldmatrix fragment loads and the output store.
// Both kernels: 256 threads, BM = MF x 32 rows x 128 columns, 8 warps as 2 (rows) x 4 (columns);
// the element type E sets the elements per 16-byte chunk (8 bf16 / fp16, 16 e4m3 codes). Each
// piece leaves both kernels' SASS as it was (checked with cuobjdump -sass); the ring's steady-state
// step (wait, sync, refill, commit) stays in each kernel because moving it here changed the SASS.
#ifndef TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_
#define TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

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

// The operand rows this thread copies into every stage are A rows (tid >> 3) + i * 32 of the
// m-tile (i < kARows) and B rows (tid >> 3) + i * 32 of the n-tile (i < 4): a_src / b_src point
// at their k = 0 element; a row past the end (ok false) reads from a valid row and copies zeros.
// (Plain arrays, not a struct: a struct changed the FP8 kernel's SASS.)

// A row r (ok: r < row_end) reads source row a_row(ok, r); B row `col` (an output column; 0
// stands for one at or past n) starts at b_row(col).
template <typename E, int kARows, typename ARow, typename BRow>
__device__ __forceinline__ void InitRows(const E* a, const ARow& a_row, const BRow& b_row, int row0,
                                         int row_end, int n0, int n, int k, int tid,
                                         const E* (&a_src)[kARows], bool (&a_ok)[kARows],
                                         const E* (&b_src)[4], bool (&b_ok)[4]) {
#pragma unroll
  for (int i = 0; i < kARows; ++i) {
    const int r = row0 + (tid >> 3) + i * 32;
    a_ok[i] = r < row_end;
    a_src[i] = a + static_cast<int64_t>(a_row(a_ok[i], r)) * k;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = n0 + (tid >> 3) + i * 32;
    b_ok[i] = col < n;
    b_src[i] = b_row(b_ok[i] ? col : 0);
  }
}

// Copies k-step `kt` (8 16-byte chunks a row; this thread's: chunk = tid & 7) of this thread's
// rows into ring stage `stage`: the A tile (kARows x 32 rows) at base + stage * kStageBytes, the
// B tile behind it.
template <int kStageBytes, typename E, int kARows>
__device__ __forceinline__ void LoadStage(uint32_t base, int kt, int stage, int k, int tid,
                                          int chunk, const E* const (&a_src)[kARows],
                                          const bool (&a_ok)[kARows], const E* const (&b_src)[4],
                                          const bool (&b_ok)[4]) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(E));  // elements per 16-byte chunk
  const int kcol = kt * 8 * kChunk + chunk * kChunk;
  const bool kok = kcol < k;
  const uint32_t sa = base + stage * kStageBytes, sb = sa + kARows * 32 * kRowBytes;
#pragma unroll
  for (int i = 0; i < kARows; ++i) {
    CpAsync16(sa + Swz((tid >> 3) + i * 32, chunk), a_src[i] + (kok ? kcol : 0), a_ok[i] && kok);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    CpAsync16(sb + Swz((tid >> 3) + i * 32, chunk), b_src[i] + (kok ? kcol : 0), b_ok[i] && kok);
  }
}

// The ring's first kStages - 1 stages; load(kt, stage).
template <int kStages, typename Load>
__device__ __forceinline__ void RingPrologue(int ktiles, const Load& load) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    internal::CpAsyncCommit();
  }
}

// Warp (wm, wn)'s ldmatrix fragments of 32-byte k-slice `ks`: A rows wm * MF * 16 + mf * 16,
// B rows (output columns) wn * 32 + nb * 16.
template <int MF>
__device__ __forceinline__ void LoadFragments(uint32_t sa, uint32_t sb, int wm, int wn, int lane,
                                              int ks, uint32_t (&af)[MF][4], uint32_t (&bf)[2][4]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
    internal::LdMatrixX4(sa + Swz(wm * MF * 16 + mf * 16 + (lane & 15), ks * 2 + (lane >> 4)),
                         af[mf]);
  }
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    internal::LdMatrixX4(
        sb + Swz(wn * 32 + nb * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)),
        bf[nb]);
  }
}

__device__ __forceinline__ void StorePair(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void StorePair(__half* dst, float x, float y) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
}

// Warp (wm, wn)'s accumulators to out[row0 + ..., n0 + ...] (row-major, n columns), rows below
// row_end and columns below n.
template <int MF, typename T>
__device__ __forceinline__ void StoreTile(const float (&acc)[MF][4][4], T* out, int row0,
                                          int row_end, int n0, int n, int wm, int wn, int lane) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int nf = 0; nf < 4; ++nf) {
      const int col = n0 + wn * 32 + nf * 8 + (lane & 3) * 2;
      if (col >= n) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row0 + wm * MF * 16 + mf * 16 + (lane >> 2) + half * 8;
        if (r < row_end) {
          StorePair(out + static_cast<int64_t>(r) * n + col, acc[mf][nf][half * 2],
                    acc[mf][nf][half * 2 + 1]);
        }
      }
    }
  }
}

}  // namespace tandem::kernels::cuda::moe_tile

#endif  // TANDEM_KERNELS_MOE_MOE_GROUPED_TILE_CUH_
