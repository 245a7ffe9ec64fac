// kRows16's shared pieces (include from .cu only): the 16-row mma.sync latent kernels over a bf16 /
// fp16 pool (mla_decode_rows16.cu) and over an FP8 pool (mla_decode_rows16_fp8.cu) stage Q, share
// the tile maxima, build P, store their rows and merge a cluster's splits alike.
#ifndef TANDEM_KERNELS_MLA_MLA_ROWS16_CUH_
#define TANDEM_KERNELS_MLA_MLA_ROWS16_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "common/cuda_status.h"
#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_phase_stamps.h"
#include "kernels/mla/mla_tma.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal::rows16_common {

using wgmma_common::PackTwo;

inline constexpr int kD = 576, kRows = 16, kKeys = 64, kThreads = 256, kWarps = kThreads / 32;
// The cluster merge (MlaPlanInput::cluster_merge) in the latent stages once every tile is read:
// the CTA's partial [16 rows][512] fp32 at 0, its LSEs [16] after it, ClusterMergeSplits' scratch.
inline constexpr int kLora = 512;
inline constexpr int kClusterLseOff = kRows * kLora * 4, kClusterScratchOff = kClusterLseOff + 64;
inline constexpr int kClusterBytes =
    kClusterScratchOff +
    internal::ClusterMergeSmemFloats(kRows, internal::kMaxClusterMergeSplits) * 4;

// Q staged once a CTA (issue 33: it was 8 warps x 72 4-byte loads of all of Q) in the last
// stage's buffer, before that stage's tile is issued: [16 rows][kQPitch bytes] (a 16-byte pad
// per row: the 8 rows of an ldmatrix then hit distinct banks), 16-byte cp.async, rows past the
// request's zero-filled. Every thread then waits for its copies and the CTA barrier follows.
inline constexpr int kQPitch = kD * 2 + 16;
template <typename T>
__device__ __forceinline__ void StageQ(const LatentParams<T>& p, const LatentCta& c, uint8_t* sq,
                                       int tid) {
  constexpr int kUnits = kD * 2 / 16;  // 72 16-byte units a row
  for (int i = tid; i < kRows * kUnits; i += kThreads) {
    const int r = i / kUnits, u = i % kUnits;
    const bool ok = c.r0 + r < c.rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(c.q0) * p.heads + c.r0 + r) * kD + u * 8 : p.q;
    CpAsync16(sq + r * kQPitch + u * 16, src, ok);
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
}

// Pair j (0..7) of a thread's accumulator row h (0: row lane / 4, 1: + 8) and its column within the
// warp's 64 output columns. The bf16 / fp16 kernel's P V (ldmatrix.trans of 16-bit V) leaves n8
// tile j's columns 8 j + 2 t4 + {0, 1} in o[4 j + 2 h + {0, 1}]; kQuadCols, the FP8 kernel's
// (mla_decode_rows16_fp8.cu: tiles of even / odd columns of each 16-column unit U) leaves columns
// 16 U + 4 t4 + {0, 1, 2, 3} in o[8 U + 2 h], o[8 U + 4 + 2 h], o[8 U + 2 h + 1], o[8 U + 5 + 2 h].
struct OutPair {
  int col;
  float a, b;
};
template <bool kQuadCols>
__device__ __forceinline__ OutPair OutPairOf(const float (&o)[32], int j, int h, int t4) {
  if constexpr (kQuadCols) {
    const int u = j / 2, q = j % 2;
    return {16 * u + 4 * t4 + 2 * q, o[8 * u + 2 * h + q], o[8 * u + 4 + 2 * h + q]};
  } else {
    return {8 * j + 2 * t4, o[4 * j + 2 * h], o[4 * j + 2 * h + 1]};
  }
}

// The epilogue: row sums over quads and warps (through red), then the thread's 2 rows x 16
// columns of o times out_scale / the row sum and (warp 0) the LSE, to o_lat / lse (direct) or the
// split's partial; kCluster: the partial to this CTA's shared memory, part [16 rows][512] and its
// LSEs at part + 16 x 512. kQuadCols: o in OutPairOf's FP8 layout.
template <typename T, bool kCluster = false, bool kQuadCols = false>
__device__ __forceinline__ void StoreRows(const LatentParams<T>& p, const LatentCta& c, float* red,
                                          int warp, int lane, const float (&o)[32],
                                          float (&l_run)[2], const float (&m_run)[2], bool direct,
                                          float* part = nullptr, float out_scale = 1.0f) {
  const int g = lane / 4, t4 = lane % 4;
  QuadSum2(l_run);
  __syncthreads();  // every warp is done with the maxima
  if (t4 == 0) {
    red[warp * kRows + g] = l_run[0];
    red[warp * kRows + g + 8] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (c.r0 + r >= c.rows_seq) continue;
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += red[w * kRows + r];
    const float inv = l > 0.0f ? out_scale / l : 0.0f;
    const int64_t row = static_cast<int64_t>(c.q0) * p.heads + c.r0 + r;
    if constexpr (kCluster) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const OutPair q = OutPairOf<kQuadCols>(o, j, h, t4);
        *reinterpret_cast<float2*>(part + r * kLora + warp * 64 + q.col) =
            make_float2(q.a * inv, q.b * inv);
      }
      if (warp == 0 && t4 == 0) {
        part[kRows * kLora + r] = l > 0.0f ? (m_run[h] + log2f(l)) * wgmma_common::kLn2 : -INFINITY;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const OutPair q = OutPairOf<kQuadCols>(o, j, h, t4);
        StorePair(p, blockIdx.x, row, warp * 64 + q.col, q.a * inv, q.b * inv, direct);
      }
      if (warp == 0 && t4 == 0) {
        StoreLse(p, blockIdx.x, row,
                 l > 0.0f ? (m_run[h] + log2f(l)) * wgmma_common::kLn2 : -INFINITY, direct);
      }
    }
  }
}

// The tile's masked scores -> this warp's row maxima in red (before barrier A).
__device__ __forceinline__ void MaskAndShareMax(float (&s)[4], int key0, int warp, int lane,
                                                const int (&vis)[2], float scale_log2, float* red) {
  float mx[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + warp * 8 + 2 * (lane % 4) + e;
      s[2 * h + e] = key < vis[h] ? s[2 * h + e] * scale_log2 : -INFINITY;
    }
    mx[h] = fmaxf(s[2 * h], s[2 * h + 1]);
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  if (lane % 4 == 0) {
    red[warp * kRows + lane / 4] = mx[0];
    red[warp * kRows + lane / 4 + 8] = mx[1];
  }
}

// After barrier A: the tile maxima (the same in every warp), the running state's update, P of
// the warp's 8 tokens rounded to T into the swizzled P buffer (kScaledP: times pk, the tokens'
// factors, the row sums keeping the unscaled weights).
template <typename T, bool kScaledP = false>
__device__ __forceinline__ void SoftmaxToP(const float (&s)[4], const float* red, int warp,
                                           int lane, float (&m_run)[2], float (&l_run)[2],
                                           float (&alpha)[2], uint8_t* sp,
                                           const float (&pk)[2] = {1.0f, 1.0f}) {
  const int g = lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = red[g + 8 * h];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w * kRows + g + 8 * h]);
    const float m_new = fmaxf(m_run[h], m);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked: a finite base
    alpha[h] = exp2f(m_run[h] - m_use);
    m_run[h] = m_new;
    const float w0 = exp2f(s[2 * h] - m_use), w1 = exp2f(s[2 * h + 1] - m_use);
    l_run[h] = l_run[h] * alpha[h] + w0 + w1;
    const int r = g + 8 * h;
    *reinterpret_cast<uint32_t*>(sp + r * 128 + ((warp ^ (r % 8)) * 16) + (lane % 4) * 4) =
        kScaledP ? PackTwo<T>(w0 * pk[0], w1 * pk[1]) : PackTwo<T>(w0, w1);
  }
}

// The cluster merge (kCluster, MlaPlanInput::cluster_merge) after the tile loop: the CTA's
// partial and LSEs into its own shared memory (the latent stages: every issued tile has landed and
// been read), then ClusterMergeSplits over the cluster's splits (cluster rank = blockIdx.x).
template <typename T>
__device__ __forceinline__ void ClusterMergeRows(const LatentParams<T>& p, const LatentCta& c,
                                                 uint8_t* smem, unsigned long long* stamps) {
  if (stamps != nullptr && threadIdx.x == 0) {
    tma_kernel::WritePhaseStamp(stamps, kMlaPhaseTicket);  // the merge's start (no ticket)
    *tma_kernel::StampWord(stamps, kMlaStampTicket) = 2;   // every CTA merges a slice
  }
  const int64_t first = static_cast<int64_t>(c.q0) * p.heads + c.r0;
  const auto row_of = [first](int rr) { return first + rr; };
  const float* part = reinterpret_cast<const float*>(smem);
  internal::ClusterMergeSplits<T, kLora>(part, part + kRows * kLora, min(kRows, c.rows_seq - c.r0),
                                         row_of, p.o_lat, p.lse,
                                         reinterpret_cast<float*>(smem + kClusterScratchOff));
  if (stamps != nullptr && threadIdx.x == 0) {
    tma_kernel::WritePhaseStamp(stamps, kMlaPhaseMergeDone);
  }
}

// A kRows16 kernel's attributes: its dynamic shared memory and, for the cluster-merge
// instantiation, clusters of up to 16 CTAs (the non-portable sizes).
template <typename Kernel>
cudaError_t SetRows16Attributes(Kernel kernel, int smem_bytes, bool cluster) {
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e == cudaSuccess && cluster) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  return e;
}

// Launches a kRows16 kernel over `grid` (kThreads threads, smem_bytes of dynamic shared memory):
// `cluster`, clusters of grid.x CTAs (MlaPlan::cluster_merge: a cluster a split group); `prewait`,
// with programmatic dependent launch (MlaPlanInput::prewait: the prologue under the kernel before).
template <typename Kernel, typename... Args>
absl::Status LaunchRows16(Kernel kernel, dim3 grid, int smem_bytes, bool cluster, bool prewait,
                          cudaStream_t stream, const Args&... args) {
  CUDA_RETURN_IF_ERROR(SetRows16Attributes(kernel, smem_bytes, cluster));
  cudaLaunchAttribute attrs[2] = {};
  unsigned int n = 0;
  if (cluster) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = grid.x;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (prewait) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, args...));
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda::mla_internal::rows16_common

#endif  // TANDEM_KERNELS_MLA_MLA_ROWS16_CUH_
