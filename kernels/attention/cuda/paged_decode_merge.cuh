// The split merge of cuda::PagedAttention (internal; included by paged_decode_launch.cuh only):
// when a plan has num_splits > 1, each decode CTA writes its split's partial (o normalized, fp32;
// natural-log LSE) to the workspace and one of these kernels combines the splits of each
// (token, head) row: one warp per row, 4 rows per 128-thread block. Unlike MergeAttnStates, a
// NaN partial poisons the row (it came from NaN inputs); -inf partials (empty splits, whose o
// is 0) drop out.
//
// MergeSplitsKernel (default) is launched with programmatic dependent launch right behind the
// decode kernel, which allows it at its first instruction: the merge's blocks are resident
// before the decode grid ends and wait in griddepcontrol.wait, so no launch gap separates the
// two. Lane s of a warp loads the LSE of split s (32 splits per step), so the max and the
// weights cost one load round trip per 32 splits, and the partial rows are read 8 splits at a
// time, 16 bytes per lane, before they are summed. CombineSplitsKernel is the merge before
// issue 35 (a launch in stream order; each split's LSE loaded serially, twice), kept for
// PagedAttentionPlanInput::legacy_split_merge (the benchmarks' same-call baseline).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_MERGE_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_MERGE_CUH_

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal {

// kPer consecutive floats of a partial row (16-byte aligned for kPer >= 4: rows are D floats).
template <int kPer>
__device__ __forceinline__ void LoadPartial(const float* src, float (&v)[kPer]) {
  if constexpr (kPer % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kPer; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(src + i);
      v[i] = x.x;
      v[i + 1] = x.y;
      v[i + 2] = x.z;
      v[i + 3] = x.w;
    }
  } else if constexpr (kPer == 2) {
    const float2 x = *reinterpret_cast<const float2*>(src);
    v[0] = x.x;
    v[1] = x.y;
  } else {
    v[0] = *src;
  }
}

// (min blocks 1: with __launch_bounds__(128) alone ptxas capped D = 128 at 32 registers and
// spilled, serializing the batched loads; it takes 64 with this.)
template <typename T, int D>
__global__ void __launch_bounds__(128, 1)
    MergeSplitsKernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                      int num_splits, int64_t rows, T* __restrict__ out, float* __restrict__ lse) {
  WaitForPrecedingGrid();  // the decode grid has completed: its partials are visible
  AllowDependentLaunch();
  const int64_t r = blockIdx.x * int64_t{4} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr int kLanes = D < 32 ? D : 32;  // lanes holding part of the row
  constexpr int kPer = D / kLanes;         // floats per lane: 1, 2, 4 or 8
  constexpr int kBatch = 8;                // partial rows in flight per lane
  if (r >= rows) return;                   // whole warp: shuffles below stay full-warp

  float m = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, part_lse[s * rows + r]);
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
  const float m_use = m == -INFINITY ? 0.0f : m;

  float o[kPer] = {};
  float sum = 0.0f;  // this lane's splits; summed over the warp at the end
  for (int s0 = 0; s0 < num_splits; s0 += 32) {
    const int n = min(32, num_splits - s0);
    const float w_lane = lane < n ? expf(part_lse[(s0 + lane) * rows + r] - m_use) : 0.0f;
    sum += w_lane;
    for (int j0 = 0; j0 < n; j0 += kBatch) {
      float v[kBatch][kPer] = {};
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (j0 + j < n && lane < kLanes) {
          LoadPartial<kPer>(part_o + ((s0 + j0 + j) * rows + r) * D + lane * kPer, v[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = __shfl_sync(0xffffffffu, w_lane, (j0 + j) & 31);
        if (j0 + j >= n) continue;
#pragma unroll
        for (int e = 0; e < kPer; ++e) o[e] = fmaf(w, v[j][e], o[e]);
      }
    }
  }
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  if (lane < kLanes) {
    T* dst = out + r * D + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[e] = FromFloat<T>(o[e] * inv);
  }
  if (lse != nullptr && lane == 0) lse[r] = sum == 0.0f ? -INFINITY : m_use + logf(sum);
}

// The merge before issue 35 (legacy_split_merge): each split's LSE loaded serially, twice.
template <typename T, int D>
__global__ void __launch_bounds__(128)
    CombineSplitsKernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        int num_splits, int64_t rows, T* __restrict__ out,
                        float* __restrict__ lse) {
  const int64_t r = blockIdx.x * int64_t{4} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr int kLanes = D < 32 ? D : 32;  // lanes holding part of the row
  constexpr int kPer = D / kLanes;         // floats per lane: 1, 2, 4 or 8
  if (r >= rows) return;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, part_lse[s * rows + r]);
  const float m_use = m == -INFINITY ? 0.0f : m;
  float o[kPer] = {};
  float sum = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float w = expf(part_lse[s * rows + r] - m_use);
    sum += w;
    if (lane >= kLanes) continue;
    const float* src = part_o + (s * rows + r) * D + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) o[e] = fmaf(w, src[e], o[e]);
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  if (lane < kLanes) {
    T* dst = out + r * D + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[e] = FromFloat<T>(o[e] * inv);
  }
  if (lse != nullptr && lane == 0) lse[r] = sum == 0.0f ? -INFINITY : m_use + logf(sum);
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_MERGE_CUH_
