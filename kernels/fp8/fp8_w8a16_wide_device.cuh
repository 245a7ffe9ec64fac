// The batch-1 W8A16 GEMV's wide lane mapping (Fp8W16Math::kTensorCoreWide), shared by the
// plain / folded kernels (fp8_w8a16_wide_cuda.cu) and the RoPE fold (fp8_w8a16_rope_cuda.cu).
// Internal: include from this package's .cu files only.
//
// The m16n8k16 A fragment puts rows g and g + 8 (g = lane / 4) in each lane, so the tensor-core
// kernel's warp load covers 8 rows x 64 bytes (4 lanes a row). Here the lanes g = 2 pr and
// 2 pr + 1 (pr = 0 .. 3) both load weight row pr + 4 h, the first the 64 bytes q = 0 of a
// 128-byte window and the second q = 1: one warp load is 4 rows x 128 bytes. B's column n is
// supplied by the lanes with g = n, which stage the activations of their own chunks, so the
// product's diagonal C[g][g] is weight row (pr + 4 h)'s dot over its q half of the windows, and
// C[g + 8][g] the same for the rows of the odd loads h; the two halves are added at the end
// (one shuffle), everything off the diagonal is discarded. Each window has 4 loads a lane
// (h = 0 .. 3, two mma sets), and a window is one 128-column scale group of grouped weights.
// Bits: NOT kTensorCore's (each row sums its two halves separately), the same run to run, and
// the same for a weight row in the same slot of its 16-row tile whatever R (the windows are
// added in order).
#ifndef TANDEM_KERNELS_FP8_FP8_W8A16_WIDE_DEVICE_CUH_
#define TANDEM_KERNELS_FP8_FP8_W8A16_WIDE_DEVICE_CUH_

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {

constexpr int kWideLoads = 16;                       // 16-byte weight loads in flight a lane
constexpr int kWindowChunks = 8;                     // 128 columns: a window, one scale group
constexpr int kWideStride = kWindowChunks * kWarps;  // chunks between a warp's windows

// The lane's place: its pair pr (weight rows pr + 4 h), its half q of each window, its chunk in
// the window (q * 4 + lane % 4).
struct WideLane {
  int pr, q, cw;
};
__device__ __forceinline__ WideLane WideLaneOf(int lane) {
  const int g = lane / 4;
  return {g / 2, g % 2, (g % 2) * 4 + lane % 4};
}

// The lane's 4 weight rows (h = 0 .. 3: tile rows pr + 4 h) of each set and their scale rows.
template <int R, typename RowOf>
__device__ __forceinline__ void WideRowsOf(const Args& p, RowOf row_of, const WideLane& wl,
                                           const uint4* (&wrow)[R][4], const float* (&srow)[R][4]) {
#pragma unroll
  for (int h = 0; h < 4; ++h) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = row_of(wl.pr + 4 * h, r);
      wrow[r][h] = reinterpret_cast<const uint4*>(p.w + row * p.k);
      srow[r][h] = p.scales + row * ScaleGroups(p.k);
    }
  }
}

// The lane's chunk c of its 4 rows of each set (clamped past k as LoadGroup), and (kGrouped)
// their scales of the chunk's 128-column group.
template <int R, bool kGrouped>
__device__ __forceinline__ void LoadWindow(const uint4* const (&wrow)[R][4],
                                           const float* const (&srow)[R][4], int c, int chunks,
                                           uint4 (&wv)[R][4], float (&sc)[R][4]) {
  const int cc = min(c, chunks - 1);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      wv[r][h] = __ldcs(wrow[r][h] + cc);
      if constexpr (kGrouped) sc[r][h] = __ldg(srow[r][h] + cc / kScaleGroupChunks);
    }
  }
}

// acc[r][s] += the lane's part of the window's 4 mma of set r, mma set s (A rows g: load 2 s,
// rows g + 8: load 2 s + 1), at its chunk c; B from the lane's own chunk (zeros past k).
template <int R>
__device__ __forceinline__ void MmaWindow(const uint4 (&wv)[R][4], const uint4* act, int c,
                                          int chunks, float (&acc)[R][2][4]) {
  uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
  if (c < chunks) b0 = act[2 * c], b1 = act[2 * c + 1];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4& b = j < 2 ? b0 : b1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t a0, a1, a2, a3;
        E4m3x4ToHalf2x2(Word(wv[r][2 * s], j), a0, a2);
        E4m3x4ToHalf2x2(Word(wv[r][2 * s + 1], j), a1, a3);
        MmaF16(acc[r][s], a0, a1, a2, a3, Word(b, (2 * j) & 3), Word(b, (2 * j + 1) & 3));
      }
    }
  }
}

// partial[warp][r][j]: the warp's sums of tile row j of set r: C[g][g] (rows pr + 8 s) and
// C[g + 8][g] (rows pr + 4 + 8 s), in lane (g, t = pr) as elements q and 2 + q: half q = 0 in the
// lanes g = 2 pr, plus half q = 1 from the lane 4 above.
template <int R>
__device__ __forceinline__ void WriteWidePartials(const float (&acc)[R][2][4], int warp, int lane,
                                                  const WideLane& wl,
                                                  float (&partial)[kWarps][R][kMmaRows]) {
  const bool writer = wl.q == 0 && lane % 4 == wl.pr;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float lo = wl.q ? acc[r][s][1] : acc[r][s][0];
      const float hi = wl.q ? acc[r][s][3] : acc[r][s][2];
      const float lo1 = __shfl_down_sync(0xffffffffu, lo, 4);
      const float hi1 = __shfl_down_sync(0xffffffffu, hi, 4);
      if (writer) {
        partial[warp][r][wl.pr + 8 * s] = lo + lo1;
        partial[warp][r][wl.pr + 4 + 8 * s] = hi + hi1;
      }
    }
  }
}

// The deep kernel's tile product (MmaTilePartialsOf) on the wide mapping: G windows in flight a
// lane (each 4 R loads), the first G before the PDL wait when p.early, then the activations
// staged as f16, warp w's windows w, w + 8, ... (their halves reloaded G windows on once used),
// the partials written. Every thread of the block calls it (barriers; one after partial).
template <int R, Fold kFold, bool kGrouped, typename RowOf>
__device__ __forceinline__ void WideTilePartials(const Args& p, RowOf row_of,
                                                 float (&partial)[kWarps][R][kMmaRows]) {
  constexpr int G = kWideLoads / (4 * R);
  constexpr int H = G / 2;
  static_assert(G % 2 == 0, "two halves");
  extern __shared__ uint4 w16_smem[];  // f16 activations [k] (kNormIn: then the norm weight [k])
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WideLane wl = WideLaneOf(lane);
  const int chunks = static_cast<int>(p.k / 16);
  const uint4* wrow[R][4];
  const float* srow[R][4];
  WideRowsOf<R>(p, row_of, wl, wrow, srow);
  const int c0 = warp * kWindowChunks + wl.cw;  // the lane's chunk in the warp's first window
  uint4 buf[G][R][4];
  float sc[G][R][4];
  const auto load_first = [&] {
#pragma unroll
    for (int u = 0; u < G; ++u) {
      LoadWindow<R, kGrouped>(wrow, srow, c0 + kWideStride * u, chunks, buf[u], sc[u]);
    }
  };
  if (p.early) load_first();
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early) load_first();
  StageActivationsF16<kFold>(p, w16_smem);
  float acc[R][2][4] = {};
  for (int g0 = warp * kWindowChunks, c = c0; g0 < chunks;
       g0 += kWideStride * G, c += kWideStride * G) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int h = 0; h < H; ++h) {  // warp-uniform conditions: mma.sync needs every lane
        const int u = half * H + h;
        if (g0 + kWideStride * u < chunks) {
          if constexpr (kGrouped) {
            float part[R][2][4] = {};
            MmaWindow<R>(buf[u], w16_smem, c + kWideStride * u, chunks, part);
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
              for (int s = 0; s < 2; ++s) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  acc[r][s][e] = fmaf(part[r][s][e], sc[u][r][2 * s + e / 2], acc[r][s][e]);
                }
              }
            }
          } else {
            MmaWindow<R>(buf[u], w16_smem, c + kWideStride * u, chunks, acc);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < H; ++h) {  // this half's next windows, G further on
        const int u = half * H + h;
        if (g0 + kWideStride * (G + u) < chunks) {
          LoadWindow<R, kGrouped>(wrow, srow, c + kWideStride * (G + u), chunks, buf[u], sc[u]);
        }
      }
    }
  }
  WriteWidePartials<R>(acc, warp, lane, wl, partial);
  __syncthreads();
}

}  // namespace tandem::kernels::cuda::fp8_w16_internal

#endif  // TANDEM_KERNELS_FP8_FP8_W8A16_WIDE_DEVICE_CUH_
