// The split merge through a thread-block cluster (internal; shared by the GQA decode kernel and
// the MLA decode kernel): the num_splits CTAs of one merge group form one cluster (cluster rank s
// = split s), each keeps its split's partial in its own shared memory, and the cluster merges the
// group's rows reading the peers' partials through distributed shared memory (mapa +
// ld.shared::cluster): no workspace partials, no fence / atomic ticket, no second launch, and the
// merge's reads spread over num_splits SMs instead of one SM's L2 read rate.
//
// The arithmetic and its order are MergeSplitsKernel's (paged_decode_merge.cuh), so rows and LSEs
// are bit-identical to MergeSplitsKernel / MergeGroupSplits: the max over the splits' LSEs (exact),
// lane s of a warp holds expf(lse_s - m) and the sum is a 16/8/4/2/1 xor-shuffle tree, the row is
// o = fmaf(w_s, v_s, o) for s = 0..n-1 in order times inv = sum == 0 ? 0 : 1 / sum, and the LSE is
// sum == 0 ? -inf : m_use + logf(sum). A NaN partial poisons its row; -inf partials (empty splits,
// whose o is 0) drop out.
//
// Work split: the n_rows x D/4 (row, 4-float column chunk) items are cut into num_splits
// contiguous slices, slice s merged by cluster rank s. Each CTA computes the weights of the rows
// its slice touches (a warp per row, a lane per split; redundantly with the CTAs sharing the row)
// from the peers' LSEs; the CTA whose slice holds a row's first chunk writes its LSE.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_CUH_

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal {

// The largest cluster ClusterMergeSplits takes (16 needs cudaFuncAttributeNonPortableClusterSize-
// Allowed on the kernel; 8 is the portable limit).
constexpr int kMaxClusterMergeSplits = 16;

// Floats of this CTA's shared memory ClusterMergeSplits needs as scratch (weights, 1/sum):
// [rows of the slice][num_splits] weights, then [rows of the slice] 1 / sum (a slice touches at
// most n_rows rows).
__host__ __device__ constexpr int64_t ClusterMergeSmemFloats(int64_t n_rows, int64_t num_splits) {
  return n_rows * (num_splits + 1);
}

// The cluster's barrier, every thread of every CTA: this CTA's shared stores before (release) are
// visible to the peers' DSMEM loads after (acquire). It also orders the CTA's own threads.
__device__ __forceinline__ void ClusterMergeBarrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ unsigned int ClusterCtaRank() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned int ClusterNumCtas() {
  unsigned int n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// The shared::cluster address of `p` (this CTA's shared memory) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t MapSharedRank(const void* p, unsigned int rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ float LoadCluster(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 LoadCluster4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// The weights of rows [row_lo, row_hi) of the group, a warp per row, lane s holding split s
// (num_splits <= 32): w[(rr - row_lo) * num_splits + s] = expf(lse_s - m_use), inv[rr - row_lo] =
// 1 / sum; the LSE of rows whose first chunk is this CTA's (rr >= lse_lo) goes to lse.
template <typename RowIndex>
__device__ __forceinline__ void ClusterMergeWeights(const float* part_lse, int num_splits,
                                                    int row_lo, int row_hi, int lse_lo,
                                                    const RowIndex& row_index, float* lse, float* w,
                                                    float* inv) {
  const int lane = threadIdx.x % 32;
  for (int rr = row_lo + static_cast<int>(threadIdx.x / 32); rr < row_hi;
       rr += static_cast<int>(blockDim.x / 32)) {
    const float l = lane < num_splits ? LoadCluster(MapSharedRank(part_lse + rr, lane)) : -INFINITY;
    float m = l;
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
    const float m_use = m == -INFINITY ? 0.0f : m;
    const float e = lane < num_splits ? expf(l - m_use) : 0.0f;
    float sum = e;
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
    if (lane < num_splits) w[(rr - row_lo) * num_splits + lane] = e;
    if (lane == 0) {
      inv[rr - row_lo] = sum == 0.0f ? 0.0f : 1.0f / sum;
      if (lse != nullptr && rr >= lse_lo) {
        lse[row_index(rr)] = sum == 0.0f ? -INFINITY : m_use + logf(sum);
      }
    }
  }
}

// Every CTA of a cluster of num_splits CTAs (cluster rank s = split s; num_splits = the cluster's
// size, 2..16) calls this with all its threads after writing its split's partial into its OWN
// shared memory: part_o [n_rows][D] floats (o normalized by the split's own sum, 16-byte
// aligned), part_lse [n_rows] floats (natural-log LSE; -inf for an empty split, whose o is 0).
// Syncs the cluster, merges this CTA's slice of the n_rows x D outputs reading every peer's
// part_o / part_lse through DSMEM, stores out[row_index(rr) * D + c] and, if lse != nullptr,
// lse[row_index(rr)] (one CTA writes each), then syncs the cluster again so no peer's shared
// memory is released (the CTA exits) while it is read. scratch: ClusterMergeSmemFloats(n_rows,
// num_splits) floats of this CTA's shared memory, not part_o / part_lse.
template <typename T, int D, typename RowIndex>
__device__ void ClusterMergeSplits(const float* part_o, const float* part_lse, int n_rows,
                                   const RowIndex& row_index, T* out, float* lse, float* scratch) {
  constexpr int kPer = 4;  // floats per item (rows are >= 16 floats)
  constexpr int kChunks = D / kPer;
  static_assert(D % kPer == 0);
  const int num_splits = static_cast<int>(ClusterNumCtas());
  const int rank = static_cast<int>(ClusterCtaRank());
  const int items = n_rows * kChunks;
  const int per = (items + num_splits - 1) / num_splits;
  const int begin = min(items, rank * per), end = min(items, begin + per);
  ClusterMergeBarrier();  // every split's partial is in its CTA's shared memory
  if (begin < end) {
    const int row_lo = begin / kChunks, row_hi = (end - 1) / kChunks + 1;
    const int lse_lo = (begin + kChunks - 1) / kChunks;     // rows whose chunk 0 is in the slice
    float* w = scratch;                                     // [row_hi - row_lo][num_splits]
    float* inv = scratch + (row_hi - row_lo) * num_splits;  // [row_hi - row_lo]
    ClusterMergeWeights(part_lse, num_splits, row_lo, row_hi, lse_lo, row_index, lse, w, inv);
    __syncthreads();
    for (int idx = begin + static_cast<int>(threadIdx.x); idx < end;
         idx += static_cast<int>(blockDim.x)) {
      const int rr = idx / kChunks, c = (idx % kChunks) * kPer;
      const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(part_o + rr * D + c));
      float4 v[kMaxClusterMergeSplits];
#pragma unroll
      for (int s = 0; s < kMaxClusterMergeSplits; ++s) {  // every load in flight before the sum
        if (s < num_splits) {
          uint32_t remote;
          asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(s));
          v[s] = LoadCluster4(remote);
        }
      }
      const float* wr = w + (rr - row_lo) * num_splits;
      float o[kPer] = {};
#pragma unroll
      for (int s = 0; s < kMaxClusterMergeSplits; ++s) {
        if (s >= num_splits) continue;
        o[0] = fmaf(wr[s], v[s].x, o[0]);
        o[1] = fmaf(wr[s], v[s].y, o[1]);
        o[2] = fmaf(wr[s], v[s].z, o[2]);
        o[3] = fmaf(wr[s], v[s].w, o[3]);
      }
      const float r_inv = inv[rr - row_lo];
      T* dst = out + row_index(rr) * D + c;
#pragma unroll
      for (int e = 0; e < kPer; ++e) dst[e] = FromFloat<T>(o[e] * r_inv);
    }
  }
  ClusterMergeBarrier();  // no CTA leaves while a peer still reads its shared memory
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_CUH_
