// Internal to kernels/moe: the decode expert GEMVs' warp-level pieces, shared by
// moe_expert_cuda.cu (MoeExpertGemvGateUp / MoeExpertGemvDown) and moe_expert_fused_cuda.cu
// (MoeExpertGemvFused): a warp streams two weight rows of one expert (gate and up of one act
// column, or two down features) against M input rows at once, fp32 sums in a fixed order, so
// every kernel built from them gives the same bits.
#ifndef TANDEM_KERNELS_MOE_MOE_EXPERT_GEMV_CUH_
#define TANDEM_KERNELS_MOE_MOE_EXPERT_GEMV_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda::moe_gemv {

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;       // 16-byte weight loads in flight per lane
constexpr int kRowsPerWarp = 2;  // weight rows a warp streams at once

// The 16-byte weight chunks c0 + 32 u (u < kUnroll) of R rows, zeros past `chunks`.
template <typename T, int R>
__device__ __forceinline__ void LoadWeightChunks(const T* const (&w)[R], int64_t c0, int64_t chunks,
                                                 uint4 (&held)[R][kUnroll]) {
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      held[q][u] =
          c < chunks ? __ldcs(reinterpret_cast<const uint4*>(w[q]) + c) : make_uint4(0, 0, 0, 0);
    }
  }
}

// acc[q][m] = w_q . a_m over R weight rows at once (k elements each; every row's loads in flight
// together), this lane's share, then summed over the warp. kVec: 16-byte loads of 8 elements
// (k % 8 == 0, rows 16-byte aligned). Each (q, m) sum runs in the same order as for one row
// alone: results do not depend on R. first_held (kVec only): `held` already holds the first
// step's chunks (LoadWeightChunks(w, lane, k / 8, held), e.g. issued before a PDL wait); the sums
// are the same either way, only when the loads are issued differs. kCoherentIn: the inputs `a`
// are read through L2 (ld.global.cg), not the read-only path: for inputs written by other
// blocks of the same grid (the fused GEMVs' act).
template <typename T, int R, int M, bool kVec, bool kCoherentIn = false>
__device__ __forceinline__ void WarpDot(const T* const (&w)[R], const T* const (&a)[M], int64_t k,
                                        int lane, float (&acc)[R][M], uint4 (&held)[R][kUnroll],
                                        bool first_held) {
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[q][m] = 0.0f;
  }
  if constexpr (kVec) {
    const int64_t chunks = k / 8;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
      if (!first_held || c0 != lane) LoadWeightChunks<T, R>(w, c0, chunks, held);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* src = reinterpret_cast<const uint4*>(a[m]) + c;
          const uint4 av = kCoherentIn ? __ldcg(src) : __ldg(src);
          const T* at = reinterpret_cast<const T*>(&av);
          float af[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) af[e] = ToFloat(at[e]);
#pragma unroll
          for (int q = 0; q < R; ++q) {
            const T* wt = reinterpret_cast<const T*>(&held[q][u]);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[q][m] = fmaf(ToFloat(wt[e]), af[e], acc[q][m]);
          }
        }
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const float wf = ToFloat(w[q][i]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          acc[q][m] = fmaf(wf, ToFloat(kCoherentIn ? __ldcg(a[m] + i) : a[m][i]), acc[q][m]);
        }
      }
    }
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        acc[q][m] += __shfl_xor_sync(0xffffffffu, acc[q][m], off);
      }
    }
  }
}

// The warp's two weight rows of expert `expert`: gate_up [E, 2 * n_out, k], rows feature and
// n_out + feature; down [E, n_out, k], rows feature and feature + 1 (the last one repeated past
// n_out, not stored).
template <typename T, bool kGateUp>
__device__ __forceinline__ void WeightRows(const T* w, int expert, int64_t n_out, int64_t k,
                                           int64_t feature, const T* (&wrow)[kRowsPerWarp]) {
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) {
    const int64_t row = kGateUp ? q * n_out + feature : min(feature + q, n_out - 1);
    wrow[q] = w + (static_cast<int64_t>(expert) * (kGateUp ? 2 : 1) * n_out + row) * k;
  }
}

// One warp's outputs over the expert's rows [begin, end), M rows per weight read: gate_up writes
// act[r, feature] = round(silu(round(g)) * round(u)) (input rows gathered through token_of_row);
// down writes out[r, feature + q] (input rows r). first_held: `held` holds the first weight
// chunks (WarpDot).
template <typename T, int M, bool kGateUp, bool kVec, bool kCoherentIn = false>
__device__ __forceinline__ void WarpRows(const T* in, const T* const (&wrow)[kRowsPerWarp],
                                         int64_t n_out, int64_t k, const DeviceMoePermutation& perm,
                                         T* out, int64_t feature, int begin, int end, int lane,
                                         uint4 (&held)[kRowsPerWarp][kUnroll], bool first_held) {
  constexpr int kFeat = kGateUp ? 1 : kRowsPerWarp;  // output features per warp
  for (int r0 = begin; r0 < end; r0 += M) {
    const T* a[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int r = min(r0 + m, end - 1);  // past the expert's rows: a repeat, not stored
      a[m] = in + static_cast<int64_t>(kGateUp ? perm.token_of_row[r] : r) * k;
    }
    float acc[kRowsPerWarp][M];
    WarpDot<T, kRowsPerWarp, M, kVec, kCoherentIn>(wrow, a, k, lane, acc, held,
                                                   first_held && r0 == begin);
    if (lane != 0) continue;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (r0 + m >= end) break;
      T* dst = out + static_cast<int64_t>(r0 + m) * n_out + feature;
      if constexpr (kGateUp) {
        // Gate and up rounded to T first, then SiluAndMul's expression (layers_cuda.h).
        const float g = ToFloat(FromFloat<T>(acc[0][m]));
        const float u = ToFloat(FromFloat<T>(acc[1][m]));
        *dst = FromFloat<T>(g / (1.0f + expf(-g)) * u);
      } else {
#pragma unroll
        for (int q = 0; q < kFeat; ++q) {
          if (feature + q < n_out) dst[q] = FromFloat<T>(acc[q][m]);
        }
      }
    }
  }
}

}  // namespace tandem::kernels::cuda::moe_gemv

#endif  // TANDEM_KERNELS_MOE_MOE_EXPERT_GEMV_CUH_
