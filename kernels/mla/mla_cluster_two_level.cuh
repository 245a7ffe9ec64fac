// kRows16's two-level cluster merge (include from mla_decode_rows16.cu only; MlaPlan::cluster_size
// < num_splits, MlaPlanInput::cluster_merge_two_level): where one cluster of num_splits CTAs per
// (request, row tile) group does not fit on the GPU at once, the group's splits form num_splits / C
// clusters of C consecutive splits (cluster rank = split % C, cluster index = split / C).
//   Level 1: each cluster merges its C splits through distributed shared memory with
//     cluster_merge.cuh's arithmetic (ClusterMergeWeights, then o = fmaf(w_s, v_s, o) over s in
//     order, times 1 / sum), but stores the merged row normalized in fp32 with its LSE into the
//     workspace's partial slot split / C (part_o / part_lse: the ticket merge's partial format),
//     not rounded to o_lat.
//   Level 2: every thread fences its stores, a cluster barrier, and the cluster's rank-0 CTA takes
//     the group's merge ticket (the in-kernel merge's counter, atomicInc wrapping back to 0: zero
//     again after every call and graph replay); it tells every CTA of its cluster whether it was
//     the last (a store into each peer's shared memory before a second cluster barrier, so no
//     CTA reads another's shared memory after it and any may then exit). The last cluster merges
//     the group's G = num_splits / C level-1 partials from L2, each of its C CTAs a slice of the
//     rows, with MergeGroupSplits (paged_decode_merge.cuh: MergeSplitsKernel's arithmetic), into
//     o_lat / lse.
// The result is the same math in another order than the one-level / ticket merges (two rounds of
// normalization): close to them and to the CPU reference, not bit-identical; deterministic (every
// order is fixed; which cluster merges level 2 does not change its arithmetic).
#ifndef TANDEM_KERNELS_MLA_MLA_CLUSTER_TWO_LEVEL_CUH_
#define TANDEM_KERNELS_MLA_MLA_CLUSTER_TWO_LEVEL_CUH_

#include <cstdint>

#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_phase_stamps.h"
#include "kernels/mla/mla_tma.cuh"

namespace tandem::kernels::cuda::mla_internal {

// The largest level-1 cluster (C in {2, 4, 8}: 8 is the portable cluster size).
inline constexpr int kMaxTwoLevelCluster = 8;

// Level 1: every CTA of a cluster of C <= kMaxTwoLevelCluster CTAs calls this with all its threads
// after writing its split's partial into its OWN shared memory (part_o [n_rows][D] floats,
// normalized, 16-byte aligned; part_lse [n_rows], -inf for an empty split): ClusterMergeSplits'
// slices, weights and sums, the merged rows stored in fp32 to out_o[row_index(rr) * D + c] (16-byte
// stores) and their LSEs to out_lse[row_index(rr)]. Syncs the cluster before (the partials are in
// place) and, after its stores and a device-wide fence, again: on return every CTA of the cluster
// has stored and fenced its slice and no peer reads this CTA's shared memory any more.
// scratch: internal::ClusterMergeSmemFloats(n_rows, C) floats, not part_o / part_lse.
template <int D, typename RowIndex>
__device__ void ClusterMergeToPartial(const float* part_o, const float* part_lse, int n_rows,
                                      const RowIndex& row_index, float* out_o, float* out_lse,
                                      float* scratch) {
  constexpr int kPer = 4;
  constexpr int kChunks = D / kPer;
  static_assert(D % kPer == 0);
  const int num_splits = static_cast<int>(internal::ClusterNumCtas());
  const int rank = static_cast<int>(internal::ClusterCtaRank());
  const int items = n_rows * kChunks;
  const int per = (items + num_splits - 1) / num_splits;
  const int begin = min(items, rank * per), end = min(items, begin + per);
  internal::ClusterMergeBarrier();  // every split's partial is in its CTA's shared memory
  if (begin < end) {
    const int row_lo = begin / kChunks, row_hi = (end - 1) / kChunks + 1;
    const int lse_lo = (begin + kChunks - 1) / kChunks;  // rows whose chunk 0 is in the slice
    float* w = scratch;
    float* inv = scratch + (row_hi - row_lo) * num_splits;
    internal::ClusterMergeWeights(part_lse, num_splits, row_lo, row_hi, lse_lo, row_index, out_lse,
                                  w, inv);
    __syncthreads();
    for (int idx = begin + static_cast<int>(threadIdx.x); idx < end;
         idx += static_cast<int>(blockDim.x)) {
      const int rr = idx / kChunks, c = (idx % kChunks) * kPer;
      const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(part_o + rr * D + c));
      float4 v[kMaxTwoLevelCluster];
#pragma unroll
      for (int s = 0; s < kMaxTwoLevelCluster; ++s) {  // every load in flight before the sum
        if (s < num_splits) {
          uint32_t remote;
          asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(s));
          v[s] = internal::LoadCluster4(remote);
        }
      }
      const float* wr = w + (rr - row_lo) * num_splits;
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxTwoLevelCluster; ++s) {
        if (s >= num_splits) continue;
        o.x = fmaf(wr[s], v[s].x, o.x);
        o.y = fmaf(wr[s], v[s].y, o.y);
        o.z = fmaf(wr[s], v[s].z, o.z);
        o.w = fmaf(wr[s], v[s].w, o.w);
      }
      const float r_inv = inv[rr - row_lo];
      *reinterpret_cast<float4*>(out_o + row_index(rr) * D + c) =
          make_float4(o.x * r_inv, o.y * r_inv, o.z * r_inv, o.w * r_inv);
    }
  }
  __threadfence();                  // this thread's partial stores, device-wide, before the ticket
  internal::ClusterMergeBarrier();  // every CTA's; no peer reads this CTA's shared memory after it
}

// Level 2's ticket: after ClusterMergeToPartial (every CTA of the cluster stored and fenced), the
// cluster's rank-0 CTA takes a ticket on `counter` (atomicInc wrapping from groups - 1 back to 0)
// and stores "last" (1) or not (0) into every CTA's `flag` (a word of its shared memory, free by
// now) before a cluster barrier. True in every thread of every CTA of the cluster that arrived
// last of the group's `groups` clusters: every other cluster's level-1 stores are visible to it.
__device__ __forceinline__ bool ClusterTakeMergeTicket(unsigned int* counter, int groups,
                                                       int* flag) {
  if (internal::ClusterCtaRank() == 0 && threadIdx.x == 0) {
    const unsigned int ticket = atomicInc(counter, static_cast<unsigned int>(groups - 1));
    __threadfence();
    const int last = ticket == static_cast<unsigned int>(groups - 1) ? 1 : 0;
    const int n = static_cast<int>(internal::ClusterNumCtas());
    for (int r = 0; r < n; ++r) {
      const uint32_t remote = internal::MapSharedRank(flag, static_cast<unsigned int>(r));
      asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(remote), "r"(last) : "memory");
    }
  }
  internal::ClusterMergeBarrier();  // the flags stored (release / acquire)
  return *reinterpret_cast<volatile int*>(flag) != 0;
}

namespace rows16_two_level {

// kRows16's two-level merge after the tile loop (every thread of every CTA; the CTA's partial
// [kRows][kLora] fp32 and its LSEs [kRows] at smem, normalized; scratch_off: ClusterMergeSmemFloats
// floats past them; flag: a free word of shared memory outside both). Level-1 slot blockIdx.x / C
// of the workspace partials, then the last cluster of the group merges the slots into o_lat / lse.
template <int kRows, int kLora, typename T>
__device__ __forceinline__ void MergeRows(const LatentParams<T>& p, const LatentCta& c,
                                          uint8_t* smem, int scratch_off, int* flag,
                                          unsigned long long* stamps) {
  const int cluster = static_cast<int>(internal::ClusterNumCtas());
  const int groups = p.num_splits / cluster, slot = static_cast<int>(blockIdx.x) / cluster;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.heads;
  const int64_t first = static_cast<int64_t>(c.q0) * p.heads + c.r0;
  const int n_rows = min(kRows, c.rows_seq - c.r0);
  const auto row_of = [first](int rr) { return first + rr; };
  const float* part = reinterpret_cast<const float*>(smem);
  ClusterMergeToPartial<kLora>(part, part + kRows * kLora, n_rows, row_of,
                               p.part_o + slot * rows * kLora, p.part_lse + slot * rows,
                               reinterpret_cast<float*>(smem + scratch_off));
  unsigned int* counter = p.merge_counters + blockIdx.z * gridDim.y + blockIdx.y;
  const bool last = ClusterTakeMergeTicket(counter, groups, flag);
  if (stamps != nullptr && threadIdx.x == 0) {
    tma_kernel::WritePhaseStamp(stamps, kMlaPhaseTicket);
    *tma_kernel::StampWord(stamps, kMlaStampTicket) = last ? 2 : 1;
  }
  if (!last) return;
  // The last cluster: CTA rank k merges rows [k per, (k + 1) per) of the group's n_rows.
  const int per = (n_rows + cluster - 1) / cluster;
  const int lo = min(n_rows, static_cast<int>(internal::ClusterCtaRank()) * per);
  const int n = min(n_rows, lo + per) - lo;
  if (n > 0) {
    const int64_t mine = first + lo;
    const auto row_mine = [mine](int rr) { return mine + rr; };
    // smem (the CTA's partial) is free: no peer reads it after ClusterMergeToPartial.
    internal::MergeGroupSplits<T, kLora>(p.part_o, p.part_lse, groups, rows, n, row_mine, p.o_lat,
                                         p.lse, reinterpret_cast<float*>(smem));
  }
  if (stamps != nullptr) {  // CTA-uniform
    __syncthreads();
    if (threadIdx.x == 0) tma_kernel::WritePhaseStamp(stamps, kMlaPhaseMergeDone);
  }
}

}  // namespace rows16_two_level
}  // namespace tandem::kernels::cuda::mla_internal

#endif  // TANDEM_KERNELS_MLA_MLA_CLUSTER_TWO_LEVEL_CUH_
