// Device pieces shared by the batch-1 weight-only FP8 GEMV kernels (fp8_w8a16_gemv_cuda.h): the
// register-load kernels (fp8_w8a16_gemv_cuda.cu) and the shared-memory ring kernel
// (fp8_w8a16_ring_cuda.cu) and the latency forms (fp8_w8a16_deep_cuda.cu). Internal: include from
// this package's .cu files only.
#ifndef TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_
#define TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/gemm/cuda/gemv_norm_stage.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;  // 256 threads: StageRmsNorm's (RmsNormKernel's) block size
constexpr int kLoads = 8;  // 16-byte weight loads in flight per lane, over the warp's rows

// What a kernel does around the product (gemv_cuda.cu's folds): kNormIn multiplies the staged
// RmsNorm(a); kAddOut adds the rounded product into out (the residual stream).
enum class Fold { kNone, kNormIn, kAddOut };

struct Args {
  const bf16* a;            // [k]: the activations, or the residual stream under kNormIn
  const uint8_t* w;         // [R * n, k] e4m3
  const float* scales;      // [R * n], constant along k
  const bf16* bias;         // [R * n] or null
  int64_t n, k;             // output rows (inter for SiLU-and-mul), columns
  const bf16* norm_weight;  // kNormIn: [k]
  float eps;
  bool early;  // the first weight loads before the PDL wait
};

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Grouped weights (fp8_w8a16_gemv_cuda.h): p.scales is [R * n, ceil(k / 128)], one scale per
// row and 128-column group (a partial last group its own), applied to each group's partial dot.
constexpr int kScaleGroupChunks = 128 / 16;  // 16-column chunks in a scale group
__device__ __forceinline__ int64_t ScaleGroups(int64_t k) { return (k + 127) / 128; }

// The fp32 value of weight row wr from its dot product times `unit` (the codes' f16 scale
// undone): the row's weight scale (kRowScale; grouped weights have theirs in dot already), then
// the bias.
template <bool kRowScale>
__device__ __forceinline__ float RowValue(const Args& p, int64_t wr, float dot, float unit) {
  float v;
  if constexpr (kRowScale) {
    v = dot * unit * p.scales[wr];
  } else {
    v = dot * unit;
  }
  if (p.bias != nullptr) v += __bfloat162float(p.bias[wr]);
  return v;
}

// The output of row `row` (R = 2: column `row` of SiLU(gate) * up) from its dot products:
// RowValue, the fold, one rounding.
template <typename TOut, int R, Fold kFold, bool kRowScale = true>
__device__ __forceinline__ void StoreRow(const Args& p, int64_t row, const float (&dot)[R],
                                         float unit, TOut* __restrict__ out) {
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = RowValue<kRowScale>(p, row + r * p.n, dot[r], unit);
  if constexpr (R == 2) {
    // Gate and up rounded to bf16 as the unfused path stores them, then SiluAndMul's expression
    // verbatim (expf, not __expf): bit-identical to the two kernels.
    const float g = __bfloat162float(__float2bfloat16_rn(v[0]));
    const float u = __bfloat162float(__float2bfloat16_rn(v[1]));
    out[row] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
  } else if constexpr (kFold == Fold::kAddOut) {
    // The unfused path's two roundings: the product to bf16, then FusedAddRmsNorm's update.
    const float prev = __bfloat162float(out[row]);
    out[row] = __float2bfloat16_rn(prev + __bfloat162float(__float2bfloat16_rn(v[0])));
  } else {
    out[row] = internal::FromFloat<TOut>(v[0]);
  }
}

constexpr int kMmaRows = 16;              // output rows per block
constexpr int kGroupChunks = 4 * kWarps;  // chunks (16 columns) between a warp's groups

__device__ __forceinline__ void E4m3x4ToHalf2x2(uint32_t q, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(q));
}

__device__ __forceinline__ void MmaF16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[r] += the lane's part of the group's 4 mma (row set r) at its chunk c. swz: the
// multi-token form's swizzle of the staged row (ConvertTokensF16: its 16-byte halves of a chunk
// swapped in odd tokens' rows); 0 for one token.
template <int R>
__device__ __forceinline__ void MmaGroup(const uint4 (&wv)[R][2], const uint4* act, int c,
                                         int chunks, float (&acc)[R][4], int swz = 0) {
  uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
  if (c < chunks) b0 = act[(2 * c) ^ swz], b1 = act[(2 * c + 1) ^ swz];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4& b = j < 2 ? b0 : b1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t a0, a1, a2, a3;
      E4m3x4ToHalf2x2(Word(wv[r][0], j), a0, a2);  // row g: k 2t, 2t + 1 | 2t + 8, 2t + 9
      E4m3x4ToHalf2x2(Word(wv[r][1], j), a1, a3);  // row g + 8
      MmaF16(acc[r], a0, a1, a2, a3, Word(b, (2 * j) & 3), Word(b, (2 * j + 1) & 3));
    }
  }
}

// 8 bf16 (one uint4) as 8 f16 (exact for 2^-14 <= |x| <= 65504).
__device__ __forceinline__ uint4 Bf16x8ToF16(const uint4& x) {
  uint32_t y[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t v = Word(x, j);
    const __half2 h = __floats2half2_rn(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
    y[j] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(y[0], y[1], y[2], y[3]);
}

// act16 [k] (shared) = the bf16 activations as f16 (Bf16x8ToF16), from global memory (src) or in
// place (src == null: the staged bf16 row already in act16). Barrier after.
__device__ __forceinline__ void StageF16(const bf16* src, int64_t k, uint4* act16) {
  for (int64_t i = threadIdx.x; i < k / 8; i += kWarps * 32) {
    act16[i] =
        Bf16x8ToF16(src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src) + i) : act16[i]);
  }
  __syncthreads();
}

// The tensor-core forms' activations into act16 [k] (shared) as f16: the staged RmsNorm(a) under
// kNormIn (4 k bytes of act16: the bf16 row, then the norm weight; bit-identical to
// RmsNorm<bf16>), else a itself. Every thread of the 256 calls it (barriers).
template <Fold kFold>
__device__ __forceinline__ void StageActivationsF16(const Args& p, uint4* act16) {
  if constexpr (kFold == Fold::kNormIn) {
    bf16* staged = reinterpret_cast<bf16*>(act16);
    gemv_internal::StageRmsNorm<bf16, 1>(p.a, p.norm_weight, p.k, p.eps, staged, staged + p.k);
    StageF16(nullptr, p.k, act16);
  } else {
    StageF16(p.a, p.k, act16);
  }
}

// The chunks [begin, end) of k (16 columns each) a split-k block covers (MmaTilePartialsOf).
struct ChunkRange {
  int begin, end;
};

// The split-k form's activations (MmaTilePartialsOf): under kNormIn the whole row staged
// normalised as StageActivationsF16's, then only `range` converted to f16 in place; else only
// `range`'s activations staged, from act16's start. Returns the f16 activations of the range's
// first chunk. Every thread of the 256 calls it (barriers).
template <Fold kFold>
__device__ __forceinline__ const uint4* StageRangeF16(const Args& p, ChunkRange range,
                                                      uint4* act16) {
  const int64_t columns = int64_t{range.end - range.begin} * 16;
  if constexpr (kFold == Fold::kNormIn) {
    bf16* staged = reinterpret_cast<bf16*>(act16);
    gemv_internal::StageRmsNorm<bf16, 1>(p.a, p.norm_weight, p.k, p.eps, staged, staged + p.k);
    StageF16(nullptr, columns, act16 + 2 * range.begin);  // 2 uint4 a 16-column chunk
    return act16 + 2 * range.begin;
  } else {
    StageF16(p.a + int64_t{range.begin} * 16, columns, act16);
    return act16;
  }
}

// The lane's chunk c of rows g and g + 8 (h = 0, 1) of each row set. Past k the row's last
// chunk again (finite codes, multiplied by the zero activations MmaGroup uses there); past n row
// 0 (wrow), whose products land in C rows nobody stores.
template <int R>
__device__ __forceinline__ void LoadGroup(const uint4* const (&wrow)[R][2], int c, int chunks,
                                          uint4 (&wv)[R][2]) {
  const int cc = min(c, chunks - 1);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wv[r][h] = __ldcs(wrow[r][h] + cc);
  }
}

// The scales of rows g and g + 8 (h) of each row set for the lane's chunk c (clamped as
// LoadGroup's): a warp's 64-column group lies in one 128-column scale group.
template <int R>
__device__ __forceinline__ void LoadGroupScales(const float* const (&srow)[R][2], int c, int chunks,
                                                float (&sc)[R][2]) {
  const int g = min(c, chunks - 1) / kScaleGroupChunks;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[r][h] = __ldg(srow[r][h] + g);
  }
}

// MmaTilePartialsOf's pieces (also the persistent form's, fp8_w8a16_deep_cuda.cu, which walks
// several tiles a CTA). TileRowsOf: the lane's weight rows g and g + 8 (h) of each row set of the
// tile row_of names, and their group scales (kSplitK: from chunk `begin` of k on).
template <int R, bool kSplitK, typename RowOf>
__device__ __forceinline__ void TileRowsOf(const Args& p, RowOf row_of, int lane, int begin,
                                           const uint4* (&wrow)[R][2], const float* (&srow)[R][2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = row_of(lane / 4 + 8 * h, r);
      wrow[r][h] = reinterpret_cast<const uint4*>(p.w + row * p.k);
      srow[r][h] = p.scales + row * ScaleGroups(p.k);
      if constexpr (kSplitK) {
        wrow[r][h] += begin;
        srow[r][h] += begin / kScaleGroupChunks;
      }
    }
  }
}

// The lane's first G groups (its chunk c0 of the warp's groups 0 .. G - 1) and their scales.
template <int R, bool kGrouped, int G>
__device__ __forceinline__ void LoadFirstGroups(const uint4* const (&wrow)[R][2],
                                                const float* const (&srow)[R][2], int c0,
                                                int chunks, uint4 (&buf)[G][R][2],
                                                float (&sc)[kGrouped ? G : 1][R][2]) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    LoadGroup<R>(wrow, c0 + kGroupChunks * u, chunks, buf[u]);
    if constexpr (kGrouped) LoadGroupScales<R>(srow, c0 + kGroupChunks * u, chunks, sc[u]);
  }
}

// acc[r] = the warp's products of the tile (row set r; C's column 0: rows g in acc[r][0], g + 8
// in acc[r][2]) over its 64-column groups warp, warp + 8, ..., from the first G in buf
// (LoadFirstGroups) on, each half of buf reloaded G groups further on once used. kTokens (the
// multi-token form, fp8_w8a16_tokens_cuda.cu): B's columns are tokens, every element of acc is
// kept (columns 2 t and 2 t + 1: acc[r][0, 1] row g, acc[r][2, 3] row g + 8), act is the lane's
// token's staged row and swz its swizzle (MmaGroup).
template <int R, bool kGrouped, int G, bool kTokens = false>
__device__ __forceinline__ void MmaTileGroups(const uint4* const (&wrow)[R][2],
                                              const float* const (&srow)[R][2], const uint4* act,
                                              int warp, int c0, int chunks, uint4 (&buf)[G][R][2],
                                              float (&sc)[kGrouped ? G : 1][R][2],
                                              float (&acc)[R][4], int swz = 0) {
  constexpr int H = G / 2;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
  for (int g0 = warp * 4, c = c0; g0 < chunks; g0 += kGroupChunks * G, c += kGroupChunks * G) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int h = 0; h < H; ++h) {  // warp-uniform conditions: mma.sync needs every lane
        const int u = half * H + h;
        if (g0 + kGroupChunks * u < chunks) {
          if constexpr (kGrouped) {
            float part[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = part[r][2] = part[r][3] = 0.0f;
            MmaGroup<R>(buf[u], act, c + kGroupChunks * u, chunks, part, swz);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              acc[r][0] = fmaf(part[r][0], sc[u][r][0], acc[r][0]);
              acc[r][2] = fmaf(part[r][2], sc[u][r][1], acc[r][2]);
              if constexpr (kTokens) {
                acc[r][1] = fmaf(part[r][1], sc[u][r][0], acc[r][1]);
                acc[r][3] = fmaf(part[r][3], sc[u][r][1], acc[r][3]);
              }
            }
          } else {
            MmaGroup<R>(buf[u], act, c + kGroupChunks * u, chunks, acc, swz);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < H; ++h) {  // this half's next groups, G further on
        const int u = half * H + h;
        if (g0 + kGroupChunks * (G + u) < chunks) {
          LoadGroup<R>(wrow, c + kGroupChunks * (G + u), chunks, buf[u]);
          if constexpr (kGrouped) {
            LoadGroupScales<R>(srow, c + kGroupChunks * (G + u), chunks, sc[u]);
          }
        }
      }
    }
  }
}

// The persistent forms' (fp8_w8a16_deep_cuda.cu, fp8_w8a16_tokens_cuda.cu) lane rows of 16-row
// tile `tile` (TileRowsOf; rows past n: row 0, whose products nobody stores).
template <int R>
__device__ __forceinline__ void PersistentTileRows(const Args& p, int64_t tile, int lane,
                                                   const uint4* (&wrow)[R][2],
                                                   const float* (&srow)[R][2]) {
  const int64_t row0 = tile * kMmaRows;
  const auto row_of = [&](int j, int r) -> int64_t {
    const int64_t r0 = row0 + j;
    return r0 < p.n ? r0 + r * p.n : 0;
  };
  TileRowsOf<R, false>(p, row_of, lane, 0, wrow, srow);
}

// A persistent CTA's start: its first tile (blockIdx.x) and that tile's first G groups a lane,
// loaded before the PDL wait when p.early, else after it.
template <int R, bool kGrouped, int G>
__device__ __forceinline__ void PersistentStart(const Args& p, int lane, int c0, int chunks,
                                                const uint4* (&wrow)[R][2],
                                                const float* (&srow)[R][2], uint4 (&buf)[G][R][2],
                                                float (&sc)[kGrouped ? G : 1][R][2]) {
  PersistentTileRows<R>(p, blockIdx.x, lane, wrow, srow);
  if (p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
}

// partial[warp][r][j] = the warp's sum of tile row j of set r (C's column 0, lanes g * 4).
template <int R>
__device__ __forceinline__ void WriteTilePartials(const float (&acc)[R][4], int warp, int lane,
                                                  float (&partial)[kWarps][R][kMmaRows]) {
  if (lane % 4 == 0) {  // C's column 0: rows g (c[0]) and g + 8 (c[2])
#pragma unroll
    for (int r = 0; r < R; ++r) {
      partial[warp][r][lane / 4] = acc[r][0];
      partial[warp][r][lane / 4 + 8] = acc[r][2];
    }
  }
}

// The tensor-core kernels' product of one block's 16-row tile of each of R row sets (R = 2:
// SiLU-and-mul's gate and up rows, the RoPE fold's pair rows): tile row j of set r is weight row
// row_of(j, r) (an int64_t; rows past the weight map to any valid row, e.g. 0: their products
// land in tile rows nobody stores); lane (g = lane / 4) streams rows g and g + 8 of each set
// (kGrouped: their group scales beside the codes); the first G groups a lane are loaded before
// the PDL wait when p.early; then the activations staged as f16 (StageActivationsF16), warp w's
// 64-column groups w, w + 8, ... through MmaGroup, and the warps' sums of tile row j of set r
// into partial[warp][r][j]. kGrouped: each group's 4 mma go into zeros, then C's rows g (c[0])
// and g + 8 (c[2]) times their scales into the fp32 accumulators. Every thread of the block
// calls it (barriers; one after partial is written).
//
// MmaTilePartialsOf generalises it (MmaTilePartials is its kLoads, whole-k instance): kLaneLoads
// 16-byte loads in flight a lane (Fp8W16Math::kTensorCoreDeep: 2 kLoads), and under kSplitK
// (Fp8W16Math::kTensorCoreSplitK) the block's product covers only the chunks [range.begin,
// range.end) of k (begin a multiple of kScaleGroupChunks: a 128-column scale group), the warps
// taking that range's 64-column groups as the whole-k form takes k's; under kNormIn the whole
// row is still normalised (the norm needs it) and only the range converted to f16, else only the
// range's activations are staged (act16 [end - begin chunks]).
template <int R, Fold kFold, bool kGrouped, int kLaneLoads, bool kSplitK, typename RowOf>
__device__ __forceinline__ void MmaTilePartialsOf(const Args& p, RowOf row_of,
                                                  float (&partial)[kWarps][R][kMmaRows],
                                                  ChunkRange range) {
  constexpr int G = kLaneLoads / (2 * R);  // groups in flight a lane
  static_assert(G % 2 == 0, "two halves");
  extern __shared__ uint4 w16_smem[];  // f16 activations [k] (kNormIn: then the norm weight [k])
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = kSplitK ? range.end - range.begin : static_cast<int>(p.k / 16);
  const uint4* wrow[R][2];
  const float* srow[R][2];  // kGrouped
  TileRowsOf<R, kSplitK>(p, row_of, lane, range.begin, wrow, srow);
  const int c0 = warp * 4 + lane % 4;  // the lane's chunk in the warp's first group
  uint4 buf[G][R][2];
  float sc[kGrouped ? G : 1][R][2];
  if (p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
  const uint4* act = w16_smem;
  if constexpr (kSplitK) {
    act = StageRangeF16<kFold>(p, range, w16_smem);
  } else {
    StageActivationsF16<kFold>(p, w16_smem);
  }
  float acc[R][4];
  MmaTileGroups<R, kGrouped, G>(wrow, srow, act, warp, c0, chunks, buf, sc, acc);
  WriteTilePartials<R>(acc, warp, lane, partial);
  __syncthreads();
}

template <int R, Fold kFold, bool kGrouped, typename RowOf>
__device__ __forceinline__ void MmaTilePartials(const Args& p, RowOf row_of,
                                                float (&partial)[kWarps][R][kMmaRows]) {
  MmaTilePartialsOf<R, kFold, kGrouped, kLoads, false>(p, row_of, partial, ChunkRange{0, 0});
}

// dot[r] = tile row j's sum over the warps' partials (set r), warp 0 first.
template <int R>
__device__ __forceinline__ void SumPartials(const float (&partial)[kWarps][R][kMmaRows], unsigned j,
                                            float (&dot)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    dot[r] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) dot[r] += partial[w][r][j];
  }
}

// The body of a kernel of one 16-row tile a block (Fp8W16MmaKernel, its deep and wide forms):
// tile row j of set r is weight row 16 blockIdx.x + j (+ r n; past n row 0, whose products
// nobody stores); `products(row_of, partial)` (every thread calls it) leaves the warps' sums of
// tile row j of set r in partial[warp][r][j]; thread j < 16 adds them (SumPartials) and stores row
// 16 blockIdx.x + j (StoreRow; kGrouped: the scales already in the sums).
template <typename TOut, int R, Fold kFold, bool kGrouped, typename Products>
__device__ __forceinline__ void TileKernelBody(const Args& p, TOut* __restrict__ out,
                                               Products products) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  __shared__ float partial[kWarps][R][kMmaRows];
  const int64_t row0 = int64_t{blockIdx.x} * kMmaRows;
  const auto row_of = [&](int j, int r) -> int64_t {  // past n: row 0 (not stored)
    const int64_t r0 = row0 + j;
    return r0 < p.n ? r0 + r * p.n : 0;
  };
  products(row_of, partial);
  const int64_t row = row0 + threadIdx.x;
  if (threadIdx.x >= kMmaRows || row >= p.n) return;
  float dot[R];
  SumPartials<R>(partial, threadIdx.x, dot);
  StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out);
}

// A kernel's static shared memory (the mma kernel's partial sums, StageRmsNorm's warp sums) counts
// against the same 48 KiB default as the dynamic staging: opt in whenever both together pass it
// (k = 24,576 staged, or 4 k = 48 KiB with the norm folded in, is the default alone).
template <typename Kernel>
absl::Status OptInPastTheDefaultSmem(Kernel kernel, size_t dynamic_bytes) {
  // Both kernels' static parts are < 8 KiB: below 40 KiB dynamic no query (one per launch).
  if (dynamic_bytes <= size_t{40} * 1024) return absl::OkStatus();
  cudaFuncAttributes attributes{};
  CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  if (dynamic_bytes + attributes.sharedSizeBytes <= size_t{48} * 1024) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(dynamic_bytes)));
  return absl::OkStatus();
}

// The (TOut, R, Fold) forms the 16-row-tile kernel families are instantiated in (the deep,
// persistent and split-k forms, fp8_w8a16_deep_cuda.cu; the wide one, fp8_w8a16_wide_cuda.cu):
// X(TOut, R, kFold) for each, as the header's entry points call them.
#define TANDEM_W16_TILE_FORMS(X) \
  X(bf16, 1, Fold::kNone)        \
  X(float, 1, Fold::kNone)       \
  X(bf16, 1, Fold::kNormIn)      \
  X(bf16, 2, Fold::kNormIn)      \
  X(bf16, 1, Fold::kAddOut)

// Fp8W16Math::kRing / kRing2 / kRingHalf (fp8_w8a16_ring_cuda.cu): the ring's stages for these
// arguments when a CTA may take 1 / smem_share of an SM's shared memory (0: the ring does not
// fit; the caller runs Fp8W16MmaKernel instead).
int RingStages(int rows_per_set, bool norm_in, int64_t k, int smem_share);

// Launches the ring kernel with `stages` (RingStages' answer) on a persistent grid of
// min(16-row tiles, SMs x ctas_per_sm) CTAs. Bit-identical to Fp8W16MmaKernel.
template <typename TOut, int R, Fold kFold>
absl::Status LaunchRing(const Args& p, TOut* out, cudaStream_t stream, bool pdl, int stages,
                        int ctas_per_sm);

// Fp8W16Math::kTensorCoreDeep / kTensorCoreSplitK (fp8_w8a16_deep_cuda.cu). LaunchDeep: 16-row
// tiles as Fp8W16MmaKernel, 2 kLoads in flight a lane (kTensorCore's bits). LaunchSplitK: S CTAs
// a tile splitting k (SplitKShare), the tile's partials added by its last CTA; false (nothing
// launched) where S would be 1 or the workspace is too small: the caller runs kTensorCore.
template <typename TOut, int R, Fold kFold>
absl::Status LaunchDeep(const Args& p, TOut* out, cudaStream_t stream, bool pdl, bool grouped);
template <typename TOut, int R, Fold kFold>
absl::StatusOr<bool> LaunchSplitK(const Args& p, TOut* out, cudaStream_t stream, bool pdl,
                                  bool grouped, const Fp8W16SplitKWorkspace& ws);
// Fp8W16Math::kTensorCorePersistent (fp8_w8a16_deep_cuda.cu): LaunchDeep's tiles on a grid of
// min(tiles, 2 SMs) CTAs, each staging the activations once and walking its tiles (the same bits).
template <typename TOut, int R, Fold kFold>
absl::Status LaunchPersistent(const Args& p, TOut* out, cudaStream_t stream, bool pdl,
                              bool grouped);

// Fp8W16Math::kTensorCoreWide (fp8_w8a16_wide_cuda.cu): LaunchDeep's tiles on the 128-byte
// lane mapping.
template <typename TOut, int R, Fold kFold>
absl::Status LaunchWide(const Args& p, TOut* out, cudaStream_t stream, bool pdl, bool grouped);

// The multi-token form (fp8_w8a16_tokens_cuda.cu; m = 2 .. kFp8W16TokensMaxM): its dynamic
// shared memory (the m staged rows, kNormIn the norm weight after them), and its launch on a
// persistent grid of min(16-row tiles, resident CTAs).
int64_t TokensSmemBytes(int64_t m, int64_t k, bool norm_in);
// Resident CTAs an SM of the multi-token kernel (2 where two fit its shared memory, else 1).
int TokensCtasPerSm(int64_t m, int64_t k, bool norm_in, int rows_per_set);
// The NormIn forms' static bytes for the m rows' norms (8 x 8 warp sums, 8 inverse rms) beside
// the sums of the warps' products (R x 2 KiB).
inline constexpr int64_t kTokenNormStaticSmemBytes = (8 * 8 + 8) * 4;
template <typename TOut, int R, Fold kFold>
absl::Status LaunchTokens(const Args& p, int64_t m, TOut* out, cudaStream_t stream, bool pdl,
                          bool grouped);

// The split-k form's plan: S (into *splits) and the chunks a split takes (the return value, a
// multiple of kScaleGroupChunks; every split non-empty). ws.splits > 0 forces S (clamped to
// kFp8W16MaxSplits and k's 128-column groups); 0 picks the largest of 4, 2 with tiles x S <=
// sms x kSplitKResidentCtas (one wave) and k >= S x kSplitKMinColumns, else 1.
constexpr int kSplitKResidentCtas = 4;       // 256 threads x 64 registers: 4 CTAs an SM
constexpr int64_t kSplitKMinColumns = 1024;  // a split's 8 warps: 2 groups each at least
int SplitKShare(int64_t tiles, int64_t k, const Fp8W16SplitKWorkspace& ws, int sms, int* splits);

}  // namespace tandem::kernels::cuda::fp8_w16_internal

#endif  // TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_
