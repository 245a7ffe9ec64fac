// Device helpers of PagedDecodeTcKernel's non-default modes (decode_phase_stamps.h's DecodeMode;
// internal, included by paged_decode_tc_kernel.cuh only): the L2 prefetch of a split's older K/V
// rows before griddepcontrol.wait, and the in-kernel merge with phase stamps.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_PREFETCH_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_PREFETCH_CUH_

#include <cstdint>

#include "kernels/attention/cuda/decode_phase_stamps.h"
#include "kernels/attention/cuda/paged_decode_kernel.cuh"
#include "kernels/attention/cuda/paged_decode_merge.cuh"

namespace tandem::kernels::cuda::internal {

// L2 prefetch (PagedAttentionPlanInput::l2_prefetch_kv) of the K and V rows of keys [begin, end)
// of this CTA's kv head: every 128-byte line of each row, spread over the CTA's threads. Called
// before griddepcontrol.wait, so it may read only what the host wrote before the launch (the block
// table; PagedAttentionPlanInput::programmatic_launch's contract) and must be given only keys
// older than the step's new tokens (the predecessor writes those slots). A prefetch changes no
// value: results are bit-identical with or without it.
template <typename T, typename KV, int D>
__device__ __forceinline__ void PrefetchKvRowsL2(const DecodeParams<T>& p, const int32_t* table,
                                                 int kvh, int begin, int end) {
  constexpr int kRowBytes = D * static_cast<int>(sizeof(KV));
  constexpr int kLines = kRowBytes >= 128 ? kRowBytes / 128 : 1;
  constexpr int kLineElems = 128 / static_cast<int>(sizeof(KV));
  const KV* pool = static_cast<const KV*>(p.pool) + p.layer_offset + int64_t{kvh} * D;
  const int n = (end - begin) * kLines;
  for (int c = threadIdx.x; c < n; c += kDecodeThreads) {
    const int pos = begin + c / kLines;
    const int blk = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
    const int off = pos - blk * p.block_size;
    const KV* k = pool + int64_t{table[blk]} * p.block_elems + int64_t{off} * p.token_stride +
                  (c % kLines) * kLineElems;
    PrefetchL2(k);
    PrefetchL2(k + p.tile_elems);
  }
}

// kDecodeModeEarlyTable: the block-table entries of the first kAhead tiles of a split starting at
// key `begin` (lane i: page i of each tile), as PagedDecodeTcKernel's planned-length guess loads
// them (clamped inside the table row; entries past the request's last page are never used).
template <int kT, int kAhead, typename T>
__device__ __forceinline__ void LoadSplitEntries(const DecodeParams<T>& p, const int32_t* table,
                                                 int begin, int shift, bool fast,
                                                 int32_t (&entries)[kAhead]) {
#pragma unroll
  for (int t = 0; t < kAhead; ++t) {
    const int64_t page = ((begin + t * kT) >> max(shift, 0)) + threadIdx.x % 32;
    entries[t] = fast && p.max_blocks_per_seq > 0
                     ? table[page < p.max_blocks_per_seq ? page : p.max_blocks_per_seq - 1]
                     : 0;
  }
}

// MergeIfLastSplit (paged_decode_kernel.cuh) with phase stamps: the ticket, won or lost, and the
// merge's end (after MergeGroupSplits returns) in thread 0's words.
template <int D, typename T>
__device__ __forceinline__ void MergeIfLastSplitStamped(const DecodeParams<T>& p,
                                                        const DecodeCta& c, int n_rows,
                                                        void* smem) {
  if (p.merge_counters == nullptr) return;
  float* smem_f = static_cast<float*>(smem);
  const bool won = TakeMergeTicket(p.merge_counters + blockIdx.z * gridDim.y + blockIdx.y,
                                   p.num_splits, reinterpret_cast<int*>(smem_f));
  if (threadIdx.x == 0 && p.phase_stamps != nullptr) {
    WriteDecodeStamp(p.phase_stamps, kDecodePhaseTicket, won);
    *DecodeStampWord(p.phase_stamps, kDecodeStampTicket) = won ? 2 : 1;
  }
  if (!won) return;
  MergeGroupSplits<T, D>(
      p.part_o, p.part_lse, p.num_splits, p.num_tokens * p.num_q_heads, n_rows,
      [&](int rr) { return DecodeRow(p, c, rr); }, p.out, p.lse, smem_f + 4);
  if (threadIdx.x == 0 && p.phase_stamps != nullptr) {
    WriteDecodeStamp(p.phase_stamps, kDecodePhaseMergeDone, 0);
  }
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_PREFETCH_CUH_
