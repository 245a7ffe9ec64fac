// Device helpers shared by the three Hopper latent kernels (include from .cu only):
// mla_decode_wgmma.cu (cp.async ring), mla_decode_tma.cu (TMA loads, per-chunk mbarriers) and
// mla_decode_fp8.cu (FP8 codes dequantized into the tile). The tile geometry and its row copy,
// the m64n64k16 score wgmma with both operands in shared memory, named barriers, the online
// softmax of one 64-latent tile on the score accumulators, the P V step of a warpgroup and its
// epilogue (row sums, store).
#ifndef TANDEM_KERNELS_MLA_MLA_WGMMA_CUH_
#define TANDEM_KERNELS_MLA_MLA_WGMMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda::mla_internal::wgmma_common {

inline constexpr float kLn2 = 0.6931471805599453f;

// d (64 x 64, fp32) = (scale_d ? d : 0) + A (64 x 16, K-major smem) * B (16 x 64, K-major smem).
// clang-format off
#define TANDEM_MLA_WG_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TANDEM_MLA_WG_D4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define TANDEM_MLA_WG_D16(b) \
  TANDEM_MLA_WG_D4(b), TANDEM_MLA_WG_D4(b + 4), TANDEM_MLA_WG_D4(b + 8), TANDEM_MLA_WG_D4(b + 12)
template <typename T>
__device__ __forceinline__ void WgmmaSS64(float* d, uint64_t desc_a, uint64_t desc_b,
                                          uint32_t scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" TANDEM_MLA_WG_REGS32 "}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : TANDEM_MLA_WG_D16(0), TANDEM_MLA_WG_D16(16)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" TANDEM_MLA_WG_REGS32 "}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : TANDEM_MLA_WG_D16(0), TANDEM_MLA_WG_D16(16)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
}
#undef TANDEM_MLA_WG_D16
#undef TANDEM_MLA_WG_D4
#undef TANDEM_MLA_WG_REGS32
// clang-format on

// The latent tiles of both kernels: 64 rows x 576 dims of T in nine 64-column chunks of 8 KiB
// (128-byte swizzle, wgmma's K-major layout).
inline constexpr int kTileDim = 576;
inline constexpr int kChunkBytes = 64 * 128;
inline constexpr int kTileBytes = (kTileDim / 64) * kChunkBytes;  // 72 KiB

// Copies this thread's 16-byte units (part, part + 4, ...) of one 576-wide row into row `row` of
// a swizzled tile (four threads per row) by cp.async: unit u at (u / 8) * kChunkBytes + row * 128
// + ((u % 8) ^ (row % 8)) * 16. !ok zero-fills (src not read).
template <typename T>
__device__ __forceinline__ void CopyTileRow(uint8_t* tile, int row, int part, const T* src,
                                            bool ok) {
  uint8_t* dst = tile + row * 128;
#pragma unroll
  for (int i = 0; i < kTileDim / 8 / 4; ++i) {
    const int u = part + 4 * i;
    CpAsync16(dst + (u / 8) * kChunkBytes + (((u % 8) ^ (row % 8)) * 16), src + u * 8, ok);
  }
}

// Named barriers between the two warpgroups (id 0 is __syncthreads).
__device__ __forceinline__ void BarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void BarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <typename T>
__device__ __forceinline__ uint32_t PackTwo(float lo, float hi) {
  uint32_t r;
  StoreTwo(reinterpret_cast<T*>(&r), lo, hi);
  return r;
}

// S = Q K^T over the 576 dims of the tiles at q_addr and k_addr, both landed: warpgroup 0's
// accumulators (rows 16 warp + lane / 4 (+ 8), latents 8 j + 2 (lane % 4) (+ 1) in sc[4 j .. 4 j
// + 3]).
template <typename T>
__device__ __forceinline__ void Scores(float (&sc)[32], uint32_t q_addr, uint32_t k_addr) {
  using internal::prefill::SmemDesc;
  internal::prefill::WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTileDim / 16; ++kk) {
    const uint32_t off = (kk / 4) * kChunkBytes + (kk % 4) * 32;
    WgmmaSS64<T>(sc, SmemDesc(q_addr + off, 16, 1024), SmemDesc(k_addr + off, 16, 1024),
                 kk > 0 ? 1u : 0u);
  }
  internal::prefill::WgmmaCommit();
  internal::prefill::WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) internal::prefill::FenceOperand(sc[i]);
}

// Online softmax of one tile's scores (masked past vis[0] / vis[1] for the thread's two rows),
// P packed as the A fragments of the four k16 steps of P V, alpha the rescale of the old state.
template <typename T>
__device__ __forceinline__ void Softmax(float (&sc)[32], int key0, int t4, const int (&vis)[2],
                                        float scale_log2, float (&m_run)[2], float (&l_run)[2],
                                        float (&alpha)[2], uint32_t (&pa)[4][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int key = key0 + (i / 4) * 8 + 2 * t4 + (i & 1);
    const int h = (i % 4) / 2;
    sc[i] = key < vis[h] ? sc[i] * scale_log2 : -INFINITY;
    mx[h] = fmaxf(mx[h], sc[i]);
  }
  float m_use[2];
  mla_internal::UpdateRunningMax2(mx, m_run, l_run, alpha, m_use);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    float w[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int h = (e % 4) / 2;
      w[e] = exp2f(sc[8 * kk + e] - m_use[h]);
      l_run[h] += w[e];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) pa[kk][e] = PackTwo<T>(w[2 * e], w[2 * e + 1]);
  }
}

// P of one tile in shared memory as warpgroup 0 hands it to warpgroup 1: [4 k16 steps][128
// threads] uint4, each thread's A fragments of P V (the same thread slot holds the same rows in
// both warpgroups).
__device__ __forceinline__ void StoreP(uint4* sp, int wt, const uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sp[kk * 128 + wt] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
  }
}
__device__ __forceinline__ void LoadP(const uint4* sp, int wt, uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint4 v = sp[kk * 128 + wt];
    pa[kk][0] = v.x;
    pa[kk][1] = v.y;
    pa[kk][2] = v.z;
    pa[kk][3] = v.w;
  }
}

// O[:, 256 wg .. + 256) = alpha * O + P V for the tile at shared address k_addr (its first 512
// dims, read N-major): the thread's two rows rescaled by alpha[0] / alpha[1], then two n128 wgmma
// chains over the tile's 64-column chunks 4 wg .. 4 wg + 3 with P (A fragments) from registers,
// committed as one group and NOT waited for: o and pa stay untouched until WaitPv.
template <typename T>
__device__ __forceinline__ void RescaleAndIssuePv(float (&o)[128], uint32_t (&pa)[4][4],
                                                  const float (&alpha)[2], uint32_t k_addr,
                                                  int wg) {
  using internal::prefill::FenceOperand;
  using internal::prefill::SmemDesc;
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    o[i] *= alpha[(i % 4) / 2];
    FenceOperand(o[i]);
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) FenceOperand(pa[kk][e]);
  }
  internal::prefill::WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t v = k_addr + wg * 4 * kChunkBytes + kk * 16 * 128;
    internal::prefill::WgmmaRS<T, 128>(o, pa[kk], SmemDesc(v, kChunkBytes, 1024));
    internal::prefill::WgmmaRS<T, 128>(o + 64, pa[kk],
                                       SmemDesc(v + 2 * kChunkBytes, kChunkBytes, 1024));
  }
  internal::prefill::WgmmaCommit();
}

// Waits for the warpgroup's wgmma groups; o (and the P fragments pa they read) final after it.
__device__ __forceinline__ void WaitPv(float (&o)[128], uint32_t (&pa)[4][4]) {
  using internal::prefill::FenceOperand;
  internal::prefill::WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) FenceOperand(o[i]);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) FenceOperand(pa[kk][e]);
  }
}

// RescaleAndIssuePv, then waits: returns when the P V wgmma are done.
template <typename T>
__device__ __forceinline__ void RescaleAndAddPv(float (&o)[128], uint32_t (&pa)[4][4],
                                                const float (&alpha)[2], uint32_t k_addr, int wg) {
  using internal::prefill::FenceOperand;
  RescaleAndIssuePv<T>(o, pa, alpha, k_addr, wg);
  internal::prefill::WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) FenceOperand(o[i]);
}

// Warpgroup 0's softmax sums of the thread's two rows (row_lo, row_lo + 8), quad-summed, to both
// warpgroups in l, through `sl` (64 floats of shared memory no thread uses any more); CTA-wide
// barriers before and after.
__device__ __forceinline__ void ShareWg0RowSums(float* sl, int wg, int t4, int row_lo,
                                                float (&l_run)[2], float (&l)[2]) {
  __syncthreads();
  if (wg == 0) {
    QuadSum2(l_run);
    if (t4 == 0) {
      sl[row_lo] = l_run[0];
      sl[row_lo + 8] = l_run[1];
    }
  }
  __syncthreads();
  l[0] = sl[row_lo];
  l[1] = sl[row_lo + 8];
}

// The epilogue of a warpgroup: its 256 columns of the thread's two finished rows (row_lo and
// row_lo + 8 of the CTA's 64 from r0; l their quad-summed softmax sums, m_run their maxima), and
// from warpgroup 0 their LSE; rows past the request's rows_seq are skipped. direct: o_lat / lse
// (default: unsplit plans), else the split's fp32 partial.
template <typename T>
__device__ __forceinline__ void StoreWgRows(const LatentParams<T>& p, int split, int q0, int r0,
                                            int rows_seq, int row_lo, int wg, int t4,
                                            const float (&o)[128], const float (&l)[2],
                                            const float (&m_run)[2], bool direct) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_lo + 8 * h;
    if (r0 + r >= rows_seq) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const int64_t row = static_cast<int64_t>(q0) * p.heads + r0 + r;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      StorePair(p, split, row, wg * 256 + j * 8 + 2 * t4, o[4 * j + 2 * h] * inv,
                o[4 * j + 2 * h + 1] * inv, direct);
    }
    if (wg == 0 && t4 == 0) {
      StoreLse(p, split, row, l[h] > 0.0f ? (m_run[h] + log2f(l[h])) * kLn2 : -INFINITY, direct);
    }
  }
}
template <typename T>
__device__ __forceinline__ void StoreWgRows(const LatentParams<T>& p, int split, int q0, int r0,
                                            int rows_seq, int row_lo, int wg, int t4,
                                            const float (&o)[128], const float (&l)[2],
                                            const float (&m_run)[2]) {
  StoreWgRows(p, split, q0, r0, rows_seq, row_lo, wg, t4, o, l, m_run, p.num_splits == 1);
}

}  // namespace tandem::kernels::cuda::mla_internal::wgmma_common

#endif  // TANDEM_KERNELS_MLA_MLA_WGMMA_CUH_
