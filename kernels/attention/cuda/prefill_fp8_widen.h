// Internal to paged_prefill_cuda: the fp8 e4m3 pool widened for the Hopper wgmma prefill kernel.
//
// The wgmma kernel reads 16-bit K / V tiles. Before it runs over an fp8 pool, one layer's K and V
// of every block the batch's requests reach are copied into a compact 16-bit pool in the
// workspace, dequantized (code * scale, rounded once to T), with a block table of its own:
//
//   widened pool   [total blocks][1 layer][2 (K, V)][block_size][num_kv_heads][head_dim] of T
//   widened table  [num_seqs][table_stride] int32: request s's block j -> its offset + j
//
// where a request's offset is the blocks of the requests before it (ceil(seq_len / block_size)
// each; blocks shared by two requests are copied twice). Rows past a request's seq_len in its
// last block are written as zeros, so stale codes (NaN included) never reach the tensor cores.
//
// Thread safety: asynchronous on `stream`; reads the pool and batch, writes only the workspace.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_FP8_WIDEN_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_FP8_WIDEN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/paged_attention.h"

namespace tandem::kernels::cuda::internal::prefill {

// Bytes of the widened pool and table (each part 256-byte aligned) for `total_blocks` blocks of
// `layout`'s geometry, num_seqs table rows of table_stride entries, 16-bit elements.
int64_t Fp8WidenBytes(const KvCacheLayout& layout, int64_t total_blocks, int64_t num_seqs,
                      int64_t table_stride);

// Writes layer `layer` of `cache` (an fp8 e4m3 pool) for the requests of `batch` into
// `workspace` (Fp8WidenBytes(cache.layout, total_blocks, batch.num_seqs, table_stride) bytes,
// 256-byte aligned) and returns in *widened / *widened_batch the 16-bit view (one layer, layer 0)
// and the batch reading it (same query_start_loc and seq_lens). The device seq_lens must give at
// most total_blocks blocks in all and at most table_stride blocks a request (the plan's bounds).
// T: __nv_bfloat16 or __half.
template <typename T>
absl::Status WidenFp8Pool(const DeviceKvCache& cache, int64_t layer, const AttentionBatch& batch,
                          int64_t total_blocks, int64_t table_stride, void* workspace,
                          DeviceKvCache* widened, AttentionBatch* widened_batch,
                          cudaStream_t stream);

}  // namespace tandem::kernels::cuda::internal::prefill

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_FP8_WIDEN_H_
