// The Hopper (sm_90a) latent attention kernel with TMA loads and FlashMLA's two-warpgroup
// "seesaw" schedule, behind MlaLatentAttention (mla_cuda.h; MlaTmaSchedule::kSeesaw) for latent
// 512 + 64, bf16 / fp16, pages of 8, 16, 32 or a multiple of 64 latents. Same CTA, loading,
// shared memory and results as mla_decode_tma.cu (the fallback and A/B baseline); our code.
//
// mla_decode_tma.cu is serial per tile: warpgroup 0 scores, runs the softmax and hands P over,
// then both add P V; warpgroup 1 idles through the scores and the softmax, warpgroup 0 through
// both P V (ncu: the tensor pipe ~50% busy, the named barriers the largest stall). Here the tiles
// go in pairs (A = tile t in stage 0, B = tile t + 1 in stage 1) and each warpgroup scores one of
// them, so the score wgmma, softmax and P V of the two overlap:
//   warpgroup 0: S_A = Q K_A^T; softmax (running max m -> m_A); P_A and m_A to shared memory,
//     arrive A; O_L = a O_L + P_A V_A[:, 0:256) (issued, not waited); wait B: P_B, m_B;
//     O_L = b O_L + P_B V_B[:, 0:256);
//   warpgroup 1: S_B = Q K_B^T; wait A: P_A, m_A; O_R = a O_R + P_A V_A[:, 256:512) (issued);
//     softmax of S_B from m_A (-> m_B) under that wgmma; P_B and m_B to shared memory, arrive B;
//     O_R = b O_R + P_B V_B[:, 256:512),
// with a = exp2(m - m_A), b = exp2(m_A - m_B): both computed by both warpgroups from the maxima
// (the same fp32 operations, so the same factors), each rescaling its own O half and row sum
// (warpgroup 0 sums the A tiles' P, warpgroup 1 the B tiles'; added at the end). One P buffer and
// one max slot per thread serve both directions: warpgroup 0 writes A, warpgroup 1 reads it and
// only then writes B, warpgroup 0 reads B and only then writes the next A (each thread slot is
// touched by the same-numbered thread of each warpgroup, in that order, the two named barriers
// between). A stage's chunks are reloaded by the warpgroup that last reads them: chunks 0-3 (the
// left V half) by warp 0 once warpgroup 0's P V on them is done, chunks 4-8 by warp 4 once
// warpgroup 1's is (the score wgmma of the tile finished before its arrive).
// The last tile's rows past the split's end (a page box is loaded whole) are zeroed in V by each
// warpgroup in the half it reads, after the scores (masked to -inf by select) and before its P V.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_tma.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace: the compute_90 pass compiles the kernel body away, and nvcc would
// then flag every helper of internal linkage as unused.
namespace seesaw_kernel {

using namespace tma_kernel;  // NOLINT: the shared TMA plan and helpers of mla_tma.cuh
using internal::prefill::FenceProxyAsync;
using internal::prefill::MbarInit;
using wgmma_common::BarArrive;
using wgmma_common::BarSync;
using wgmma_common::CopyTileRow;
using wgmma_common::LoadP;
using wgmma_common::RescaleAndIssuePv;
using wgmma_common::Softmax;
using wgmma_common::StoreP;
using wgmma_common::StoreWgRows;
using wgmma_common::WaitPv;

// Named barriers (0 is __syncthreads): A and B of a pair (both warpgroups: one arrives, the other
// waits), and one per warpgroup for its own tail zeroing.
inline constexpr int kBarA = 1, kBarB = 2, kBarZero0 = 3;

// What both warpgroups' halves of a pair need (per thread).
template <typename T>
struct Pair {
  const LatentParams<T>* p;
  const CUtensorMap* map;
  TmaGeometry g;
  uint8_t* smem;
  uint4* sp;   // P: [4 k16 steps][128 threads] uint4
  float2* sm;  // the running max of the thread's two rows: [128 threads]
  uint64_t* full;
  uint32_t q_addr;
  int kb, ke, num_tiles, boxes, wt, warp, lane, t4;
  int vis[2];
  __device__ uint32_t Stage(int s) const { return q_addr + (1 + s) * kTileBytes; }
  __device__ uint32_t Bars(int s) const { return SmemAddr(full) + s * kChunks * 8; }
};

// The sender's new running maxima m_new (fmaxf of the old and the tile's) adopted by the other
// warpgroup: the factor alpha = exp2(m_run - m_use) it computed (m_use = 0 where every score so
// far is masked, as in UpdateRunningMax2), applied to the row sums; m_run = m_new.
__device__ __forceinline__ void AdoptMax(float2 m_new, float (&m_run)[2], float (&l_run)[2],
                                         float (&alpha)[2]) {
  const float m[2] = {m_new.x, m_new.y};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_use = m[h] == -INFINITY ? 0.0f : m[h];
    alpha[h] = exp2f(m_run[h] - m_use);
    m_run[h] = m[h];
    l_run[h] *= alpha[h];
  }
}

// Zeroes the V rows past the split's end of the stage at `s`'s chunks [c0, c0 + 4) (the half
// warpgroup wg reads) if the tile at key0 is the partial last one; the warpgroup then syncs.
template <typename T>
__device__ __forceinline__ void ZeroOwnTail(const Pair<T>& x, int s, int key0, int wg) {
  if (x.ke - key0 >= kKeys) return;
  ZeroTailChunks(x.smem + (1 + s) * kTileBytes, x.ke - key0, x.wt, 128, 4 * wg, 4 * wg + 4);
  BarSync(kBarZero0 + wg, 128);
}

// Once warpgroup wg's P V on stage s is done: its issuing warp (0 or 4) reloads the chunks of the
// stage it read last (0-3, or 4-8) with tile `next`, if there is one (rows: its lanes' box rows).
template <typename T>
__device__ __forceinline__ void Reload(const Pair<T>& x, int s, int wg, int next, int rows) {
  if (x.warp != (wg == 0 ? 0 : kIssueWarp) || next >= x.num_tiles) return;
  IssueChunks(x.map, x.g, rows, x.boxes, x.Stage(s), x.Bars(s), x.lane, 4 * wg,
              wg == 0 ? 4 : kChunks);
}

// Warpgroup wg's O half = f O + P V of the tile at key0 in stage s (P fragments pf), waited for;
// then Reload.
template <typename T>
__device__ __forceinline__ void AddPvAndReload(const Pair<T>& x, int s, int key0, int wg,
                                               float (&o)[128], uint32_t (&pf)[4][4],
                                               const float (&f)[2], int next, int rows) {
  ZeroOwnTail(x, s, key0, wg);
  RescaleAndIssuePv<T>(o, pf, f, x.Stage(s), wg);
  WaitPv(o, pf);
  Reload(x, s, wg, next, rows);
}

// Warpgroup 0's half of the pair (t, t + 1): rows_a / rows_b the box rows of tiles t + 2 / t + 3
// (warp 0's lanes).
template <typename T>
__device__ __forceinline__ void Wg0Pair(const Pair<T>& x, int t, float (&o)[128], float (&m_run)[2],
                                        float (&l_run)[2], int rows_a, int rows_b) {
  const bool has_b = t + 1 < x.num_tiles;
  const int key_a = x.kb + t * kKeys, key_b = key_a + kKeys;
  uint32_t pa[4][4], pb[4][4];
  float alpha[2], beta[2];
  {
    float sc[32];
    ScoresByChunk<T>(sc, x.q_addr, x.Stage(0), x.full, (t >> 1) & 1);
    Softmax<T>(sc, key_a, x.t4, x.vis, x.p->scale_log2, m_run, l_run, alpha, pa);
  }
  StoreP(x.sp, x.wt, pa);
  x.sm[x.wt] = make_float2(m_run[0], m_run[1]);
  BarArrive(kBarA, kMlaWgmmaThreads);
  ZeroOwnTail(x, 0, key_a, 0);
  RescaleAndIssuePv<T>(o, pa, alpha, x.Stage(0), 0);
  if (has_b) {
    BarSync(kBarB, kMlaWgmmaThreads);  // warpgroup 1's P_B and m_B
    LoadP(x.sp, x.wt, pb);
    AdoptMax(x.sm[x.wt], m_run, l_run, beta);
  }
  WaitPv(o, pa);
  Reload(x, 0, 0, t + 2, rows_a);
  if (has_b) AddPvAndReload(x, 1, key_b, 0, o, pb, beta, t + 3, rows_b);
}

// Warpgroup 1's half of the pair (t, t + 1); rows_a / rows_b as above (warp 4's lanes).
template <typename T>
__device__ __forceinline__ void Wg1Pair(const Pair<T>& x, int t, float (&o)[128], float (&m_run)[2],
                                        float (&l_run)[2], int rows_a, int rows_b) {
  const bool has_b = t + 1 < x.num_tiles;
  const int key_a = x.kb + t * kKeys, key_b = key_a + kKeys;
  uint32_t pa[4][4], pb[4][4];
  float alpha[2], beta[2];
  float sc[32];
  if (has_b) ScoresByChunk<T>(sc, x.q_addr, x.Stage(1), x.full + kChunks, (t >> 1) & 1);
  BarSync(kBarA, kMlaWgmmaThreads);  // warpgroup 0's P_A and m_A
  LoadP(x.sp, x.wt, pa);
  AdoptMax(x.sm[x.wt], m_run, l_run, alpha);
  ZeroOwnTail(x, 0, key_a, 1);
  RescaleAndIssuePv<T>(o, pa, alpha, x.Stage(0), 1);
  if (has_b) {  // the softmax of B under P_A V_A
    Softmax<T>(sc, key_b, x.t4, x.vis, x.p->scale_log2, m_run, l_run, beta, pb);
    StoreP(x.sp, x.wt, pb);
    x.sm[x.wt] = make_float2(m_run[0], m_run[1]);
    BarArrive(kBarB, kMlaWgmmaThreads);
  }
  WaitPv(o, pa);
  Reload(x, 0, 1, t + 2, rows_a);
  if (has_b) AddPvAndReload(x, 1, key_b, 1, o, pb, beta, t + 3, rows_b);
}

// Both warpgroups' softmax sums of the thread's two rows (row_lo, row_lo + 8), quad-summed and
// added, to both in l, through `sl` (128 floats of shared memory no thread uses any more).
__device__ __forceinline__ void ShareSummedRowSums(float* sl, int wg, int t4, int row_lo,
                                                   float (&l_run)[2], float (&l)[2]) {
  __syncthreads();
  QuadSum2(l_run);
  if (t4 == 0) {
    sl[wg * 64 + row_lo] = l_run[0];
    sl[wg * 64 + row_lo + 8] = l_run[1];
  }
  __syncthreads();
  l[0] = sl[row_lo] + sl[64 + row_lo];
  l[1] = sl[row_lo + 8] + sl[64 + row_lo + 8];
}

template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaThreads, 1)
    MlaSeesawKernel(const __grid_constant__ LatentParams<T> p,
                    const __grid_constant__ CUtensorMap map, const TmaGeometry g) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const LatentCta c = LatentCtaOf(p, kRows);
  if (c.r0 >= c.rows_seq || EmptySplitDone(p, c, kRows)) return;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  const int row_lo = (tid % 128 / 32) * 16 + lane / 4;
  Pair<T> x{&p,
            &map,
            g,
            smem,
            reinterpret_cast<uint4*>(smem + kPOff),
            reinterpret_cast<float2*>(smem + kFOff),
            reinterpret_cast<uint64_t*>(smem + kBarOff),
            SmemAddr(smem),
            c.kb,
            c.ke,
            c.Tiles(kKeys),
            kKeys / g.box_rows,
            tid % 128,
            tid / 32,
            lane,
            lane % 4,
            {c.KeyEnd(p, row_lo), c.KeyEnd(p, row_lo + 8)}};

  if (tid == 0) {
    for (int i = 0; i < 2 * kChunks; ++i) MbarInit(x.full + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (x.warp == kIssueWarp) {  // tiles 0 and 1, every chunk
    for (int t = 0; t < 2 && t < x.num_tiles; ++t) {
      const int rows = lane < x.boxes ? BoxRow(p, g, c.table, c.kb + t * kKeys, lane, c.ke) : 0;
      IssueChunks(&map, g, rows, x.boxes, x.Stage(t), x.Bars(t), lane, 0, kChunks);
    }
  }
  {  // Q (zero rows beyond the request's), by cp.async: four threads per row.
    const int crow = tid / 4, cpart = tid % 4;
    const bool ok = c.r0 + crow < c.rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(c.q0) * p.heads + c.r0 + crow) * kD : p.q;
    CopyTileRow(smem, crow, cpart, src, ok);
    CpAsyncCommit();
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();
  }

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const bool issuer = x.warp == 0 || x.warp == kIssueWarp;
  for (int t = 0; t < x.num_tiles; t += 2) {
    // The box rows of the next pair's tiles, read now, issued mid-pair by warps 0 and 4.
    int rows_a = 0, rows_b = 0;
    if (issuer && lane < x.boxes) {
      if (t + 2 < x.num_tiles) rows_a = BoxRow(p, g, c.table, c.kb + (t + 2) * kKeys, lane, c.ke);
      if (t + 3 < x.num_tiles) rows_b = BoxRow(p, g, c.table, c.kb + (t + 3) * kKeys, lane, c.ke);
    }
    if (wg == 0) {
      Wg0Pair(x, t, o, m_run, l_run, rows_a, rows_b);
    } else {
      Wg1Pair(x, t, o, m_run, l_run, rows_a, rows_b);
    }
  }

  float l[2];
  ShareSummedRowSums(reinterpret_cast<float*>(smem + kPOff), wg, x.t4, row_lo, l_run, l);
  StoreWgRows(p, blockIdx.x, c.q0, c.r0, c.rows_seq, row_lo, wg, x.t4, o, l, m_run);
#endif
}

}  // namespace seesaw_kernel

template <typename T>
absl::Status LaunchMlaSeesaw(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                             dim3 grid, cudaStream_t stream) {
  return tma_kernel::LaunchTmaKernel<T>(seesaw_kernel::MlaSeesawKernel<T>, p, cache, layer, grid,
                                        stream);
}

template absl::Status LaunchMlaSeesaw<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                                     const DeviceKvCache&, int64_t, dim3,
                                                     cudaStream_t);
template absl::Status LaunchMlaSeesaw<__half>(const LatentParams<__half>&, const DeviceKvCache&,
                                              int64_t, dim3, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
