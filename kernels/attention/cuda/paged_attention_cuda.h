// CUDA paged decode attention over the block-major KV pool: the CUDA twin of
// kernels/attention/paged_attention.h for decode and speculative verification (q_len >= 1 new
// tokens per request, causal among themselves), with GQA/MQA, sliding window, soft-cap and LSE.
//
// Flash-decoding: one CTA per (request, kv head, row tile, KV split) computes every query head
// of the kv head's GQA group (and every new token of the row tile) from one read of each K/V
// row; splits are merged by the last split CTA of each row group (when the caller keeps the
// workspace's counters zeroed: PagedAttentionPlanInput::workspace_zeroed) or by a second kernel
// (launched with programmatic dependent launch: its blocks wait on the GPU for the decode grid
// instead of being launched after it). The split
// count comes from a host-side plan built once per step and shared by every layer; the grid depends
// only on the plan, so a captured CUDA graph replays with new seq_lens / block tables as long as
// the plan's bounds hold.
//
// Thread safety: plans are plain values. PagedAttention is asynchronous on `stream`, reads q,
// the pool and the batch metadata, and writes out, lse and the workspace (one workspace per
// concurrently running call).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_ATTENTION_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_ATTENTION_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/paged_attention.h"

namespace tandem::kernels::cuda {

// Bytes at the start of a split plan's workspace that hold the in-kernel merge's counters
// (PagedAttentionPlanInput::workspace_zeroed); the same for every plan.
inline constexpr int64_t kPagedAttentionCounterBytes = 16384;

// Host-known bounds of one step's batch.
struct PagedAttentionPlanInput {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;   // rows of q/out: query_start_loc[num_seqs] (or a padded bound)
  int64_t max_q_len = 1;    // >= every request's q_len
  int64_t max_seq_len = 0;  // >= every request's seq_len (e.g. max_model_len under graphs); only
                            // sizes the splits: under DCP the largest LOCAL length suffices
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // 16, 32, 64, 128 or 256
  KvDtype kv_dtype = KvDtype::kBf16;
  int num_sms = 132;      // cudaDevAttrMultiProcessorCount of the device
  int forced_splits = 0;  // > 0: exactly this many KV splits (tests); 0: the planner chooses
  // head_dim 64/128 runs on tensor cores (mma.sync; fp8/int8 KV widened to fp16 in registers)
  // unless this is false; otherwise, and for head_dim 16/32/256, the CUDA-core kernel runs.
  bool allow_tensor_cores = true;
  // Benchmark baseline only: the split planner and the split merge as they were before issue 35
  // (planner: waves of ctas-per-SM slots x (keys per split + 192), >= 256 keys per split; merge:
  // a stream-ordered kernel loading each split's LSE serially). Results equal within rounding.
  bool legacy_split_merge = false;
  // The caller zeroed the workspace's first kPagedAttentionCounterBytes (16 KB) once, e.g. when
  // it allocated it, and uses the workspace only for PagedAttention calls: the decode kernel then
  // merges the KV splits itself (the last split CTA of each (request, kv head, row tile), counted
  // by an atomic ticket that it resets, so graph replays and later calls find the counters zero
  // again) and no second kernel is launched. Otherwise a PDL-launched kernel merges them.
  bool workspace_zeroed = false;
  // The decode kernel is launched with programmatic dependent launch (PDL): its CTAs may start
  // while the stream's previous kernel still runs, load the request's bounds and first block-table
  // entries, and wait (griddepcontrol.wait) only before reading q, the KV pool or the workspace.
  // So the previous kernel may write q and the pool (RoPE + the KV write), but must not write
  // query_start_loc, seq_lens, local_seq_lens or the block tables; and if it was PDL-launched
  // itself it must wait for its own predecessor before it allows dependents to launch.
  bool programmatic_launch = false;
  // Merge the KV splits through a thread-block cluster (tensor-core kernel only): the num_splits
  // CTAs of each (request, kv head, row tile) form one cluster, keep their partials in shared
  // memory and merge them through distributed shared memory (cluster_merge.cuh): no workspace,
  // no merge kernel, rows and LSEs bit-identical to the other merges. Taken only where valid
  // (2..16 splits, the tensor-core kernel, not legacy_split_merge, such clusters fit the current
  // device: PlanPagedAttention queries it); PagedAttentionPlan::cluster_merge says whether.
  bool cluster_merge = false;
  // With cluster_merge: take it only where every cluster of the grid is resident at once (a
  // second wave of clusters made 8 x 1k 37% slower, BENCHMARKS.md); false (tests) takes it
  // wherever it is valid.
  bool cluster_merge_one_wave = true;
};

struct PagedAttentionPlan {
  PagedAttentionPlanInput input;
  bool use_tensor_cores = false;
  int num_splits = 1;     // KV splits per (request, kv head, row tile)
  int rows_per_warp = 1;  // query rows (token x group head) each warp keeps in registers
  int row_groups = 1;     // warps splitting a CTA's rows (the other 4 / row_groups split keys)
  int row_tiles = 1;      // CTAs along the rows of one (request, kv head)
  int64_t workspace_bytes = 0;   // device scratch PagedAttention needs (0 when num_splits == 1)
  bool merge_in_kernel = false;  // the decode kernel merges the splits (see workspace_zeroed)
  bool cluster_merge = false;    // the splits merge through a cluster (see cluster_merge)
  // Why input.cluster_merge was not taken (a string literal), or null.
  const char* cluster_merge_fallback = nullptr;
};

// Chooses the split count from batch x kv heads x row tiles against the SM count (an SM streams
// its CTAs' keys at about one rate whether it holds one CTA or two, each CTA has a fixed cost,
// the merge a small one: at batch 1 about one CTA per SM) and the row tiling from the GQA group
// and max_q_len. INVALID_ARGUMENT for non-positive head counts, num_q_heads not a multiple of
// num_kv_heads, an unsupported head_dim, negative sizes, or a grid beyond CUDA's limits.
absl::StatusOr<PagedAttentionPlan> PlanPagedAttention(const PagedAttentionPlanInput& input);

// Semantics of cpu::PagedAttention: sequence s has q_len = query_start_loc[s+1] -
// query_start_loc[s] new tokens; its token j sits at position seq_lens[s] - q_len + j and
// attends to [0, pos] (narrowed by window_left), scores scaled, optionally soft-capped; a query
// with no visible key gets out = 0, lse = -inf; NaN in q or a visible K row gives NaN.
// `batch` holds DEVICE pointers (query_start_loc, seq_lens, block_tables); its num_seqs and the
// pool geometry must match the plan. Requests with q_len 0 (padding) are skipped.
//
// Decode context parallelism (params.dcp_size > 1): as cpu::PagedAttention, the pool holds rank
// dcp_rank's KV shard at local indices (batch.local_seq_lens, DEVICE, = DcpLocalCount of the
// global seq_lens) and queries keep global positions; the result is the shard's partial (out, lse)
// for the DCP exchange (dcp_exchange_cuda.h). Any q_len (decode, verification, a prefill chunk);
// keys at local index >= local_seq_lens[s] are never read. dcp_size 1 runs the unchanged path.
//
// q: [num_tokens, num_q_heads, head_dim] of T; out: same shape of T; lse: [num_tokens,
// num_q_heads] fp32 natural log, or null. T is __nv_bfloat16 or __half; the pool is T's own
// dtype, fp8 e4m3 or int8 (dequantized on the fly: the reference semantics hold for the
// dequantized K/V). workspace: plan.workspace_bytes of device memory (may be null when 0). The
// pointers must be 16-byte aligned. Rows of out beyond query_start_loc[num_seqs] (graph padding)
// get unspecified values.
//
// INVALID_ARGUMENT (nothing launched) on: invalid cache view, layer out of range, plan/cache
// mismatch, scale not finite and > 0, softcap negative or not finite, window_left < -1, an
// invalid DCP shard or null local_seq_lens under DCP, null or unaligned pointers. Batch contents
// (device memory) are NOT validated: they are the caller's contract, as the CPU op checks them.
template <typename T>
absl::Status PagedAttention(const T* q, const DeviceKvCache& cache, int64_t layer,
                            const AttentionBatch& batch, const AttentionParams& params,
                            const PagedAttentionPlan& plan, T* out, float* lse, void* workspace,
                            cudaStream_t stream);

extern template absl::Status PagedAttention<__nv_bfloat16>(
    const __nv_bfloat16*, const DeviceKvCache&, int64_t, const AttentionBatch&,
    const AttentionParams&, const PagedAttentionPlan&, __nv_bfloat16*, float*, void*, cudaStream_t);
extern template absl::Status PagedAttention<__half>(const __half*, const DeviceKvCache&, int64_t,
                                                    const AttentionBatch&, const AttentionParams&,
                                                    const PagedAttentionPlan&, __half*, float*,
                                                    void*, cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_ATTENTION_CUDA_H_
