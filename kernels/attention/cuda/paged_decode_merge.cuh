// The split merge of cuda::PagedAttention (internal; included by paged_decode_launch.cuh only):
// when a plan has num_splits > 1, each decode CTA writes its split's partial (o normalized, fp32;
// natural-log LSE) to the workspace and one of these kernels combines the splits of each
// (token, head) row: one warp per row, 4 rows per 128-thread block. Unlike MergeAttnStates, a
// NaN partial poisons the row (it came from NaN inputs); -inf partials (empty splits, whose o
// is 0) drop out.
//
// In-kernel merge (PagedAttentionPlan::merge_in_kernel): each split CTA stores its partial,
// takes a ticket on its (request, kv head, row tile)'s counter (TakeMergeTicket) and the last of
// the group's CTAs merges the group's rows itself (MergeGroupSplits): no second launch. The
// counters live in the workspace's first kMergeCounterBytes, zeroed by the caller once; atomicInc
// wraps the last ticket back to 0, so they are zero again after every call (graph replays).
// The arithmetic and its order are MergeSplitsKernel's: both merges give bit-identical rows.
//
// MergeSplitsKernel (otherwise) is launched with programmatic dependent launch right behind the
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

// The in-kernel merge's tickets: one uint32 per (request, kv head, row tile) at the start of a
// split plan's workspace (a fixed size, so plans of any shape sharing one workspace never store
// partials over the counters); the partials follow.
constexpr int64_t kMergeCounterBytes = 16384;
constexpr int64_t kMaxMergeGroups = kMergeCounterBytes / 4;
// Dynamic shared memory the in-kernel merge needs for n_rows rows of num_splits splits, in
// floats: TakeMergeTicket's flag (16 bytes, so the weights stay 16-byte aligned), then
// MergeGroupSplits' weights and row sums.
__host__ __device__ constexpr int64_t MergeSmemFloats(int64_t n_rows, int64_t num_splits) {
  return 4 + n_rows * (num_splits + 1);
}

// Call with every thread of the CTA after its partial stores: true (in every thread) in the last
// of the num_splits CTAs to arrive at `counter`, whose stores and every other split's are then
// visible to it. atomicInc wraps the counter from num_splits - 1 back to 0. flag: a word of the
// kernel's dynamic shared memory, free by now. (Not a static __shared__ variable: that shifts
// the dynamic ring by 16 bytes, and the build that had one ran bandwidth-bound decode 15% slower
// with an L2 hit rate of 50% instead of 7%, nvidia-h200-x4, ncu: each 32-byte sector of a K/V
// cp.async then lands in two 32-byte chunks of shared memory, two L2 requests; DESIGN.md.)
__device__ __forceinline__ bool TakeMergeTicket(unsigned int* counter, int num_splits, int* flag) {
  __threadfence();  // this thread's partial stores, device-wide, before the ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int ticket = atomicInc(counter, static_cast<unsigned int>(num_splits - 1));
    __threadfence();
    *flag = ticket == static_cast<unsigned int>(num_splits - 1);
  }
  __syncthreads();
  return *flag != 0;
}

// MergeGroupSplits' default probe: nothing (a measurement build passes one that stamps the
// merge's phases: 0 after the LSEs are staged, 1 after the weights).
struct NoMergeProbe {
  __device__ __forceinline__ void operator()(int) const {}
};

// The last split CTA's merge of its group's n_rows rows (row rr of the group is row
// row_index(rr) of out / lse / the partials): MergeSplitsKernel's arithmetic in its order.
// smem: MergeSmemFloats(n_rows, num_splits) - 4 floats the CTA may overwrite.
template <typename T, int D, typename RowIndex, typename Probe = NoMergeProbe>
__device__ __forceinline__ void MergeGroupSplits(const float* part_o, const float* part_lse,
                                                 int num_splits, int64_t rows, int n_rows,
                                                 const RowIndex& row_index, T* out, float* lse,
                                                 float* smem, const Probe& probe = Probe()) {
  const int tid = threadIdx.x, lane = tid % 32, nt = blockDim.x;
  float* w = smem;                          // [n_rows][num_splits]: the LSEs, then the weights
  float* inv = smem + n_rows * num_splits;  // [n_rows]: 1 / sum of the weights
  const int n = n_rows * num_splits;
  for (int i0 = 0; i0 < n; i0 += 4 * nt) {  // 4 LSE loads in flight per thread
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = i0 + j * nt + tid;
      v[j] = i < n ? __ldcg(part_lse + (i % num_splits) * rows + row_index(i / num_splits)) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i0 + j * nt + tid < n) w[i0 + j * nt + tid] = v[j];
    }
  }
  __syncthreads();
  probe(0);
  for (int rr = tid / 32; rr < n_rows; rr += nt / 32) {  // a warp per row, a lane per split
    float* wr = w + rr * num_splits;
    float m = -INFINITY;
    for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, wr[s]);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
    const float m_use = m == -INFINITY ? 0.0f : m;
    float sum = 0.0f;
    for (int s = lane; s < num_splits; s += 32) {
      const float e = expf(wr[s] - m_use);
      wr[s] = e;
      sum += e;
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
    if (lane == 0) {
      inv[rr] = sum == 0.0f ? 0.0f : 1.0f / sum;
      if (lse != nullptr) lse[row_index(rr)] = sum == 0.0f ? -INFINITY : m_use + logf(sum);
    }
  }
  __syncthreads();
  probe(1);
  constexpr int kPer = 4;  // floats per step of a thread (rows are >= 16 floats)
  constexpr int kChunks = D / kPer;
  static_assert(D % kPer == 0);
  constexpr int kBatch = 8;  // partial rows in flight per thread
  for (int idx = tid; idx < n_rows * kChunks; idx += nt) {
    const int rr = idx / kChunks;
    const int64_t row = row_index(rr);
    const float* src = part_o + row * D + (idx % kChunks) * kPer;
    const float* wr = w + rr * num_splits;
    float o[kPer] = {};
    for (int s0 = 0; s0 < num_splits; s0 += kBatch) {
      float v[kBatch][kPer] = {};
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < num_splits) {
          const float4 x = __ldcg(reinterpret_cast<const float4*>(src + (s0 + j) * rows * D));
          v[j][0] = x.x;
          v[j][1] = x.y;
          v[j][2] = x.z;
          v[j][3] = x.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j >= num_splits) continue;
#pragma unroll
        for (int e = 0; e < kPer; ++e) o[e] = fmaf(wr[s0 + j], v[j][e], o[e]);
      }
    }
    T* dst = out + row * D + (idx % kChunks) * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[e] = FromFloat<T>(o[e] * inv[rr]);
  }
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
