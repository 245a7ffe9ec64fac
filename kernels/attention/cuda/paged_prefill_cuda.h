// CUDA paged prefill / extend attention over the block-major KV pool: the tensor-core twin of
// kernels/attention/paged_attention.h for many new tokens per request (prompt prefill, chunked
// prefill over a paged prefix), variable lengths in one launch, GQA/MQA, sliding window,
// soft-cap, O and natural-log LSE; the pool bf16/fp16 (the activations' dtype) or fp8 e4m3.
//
// FlashAttention-style: a work item is (request, kv head, tile of query rows), the rows being
// (new token x query head of the kv head's GQA group) so every K/V row read from the pool
// serves the whole group. Key tiles stream from the pages through a shared-memory ring, scores
// and P.V run on tensor cores with an online softmax in registers, and key tiles wholly above
// the causal diagonal (or left of the window) are never touched. Two kernels:
//   * Hopper (sm_90a) for head_dim 64/128: one producer warpgroup copies Q and paged K/V
//     tiles (cp.async, completion on mbarriers), two consumer warpgroups of 64 rows each run
//     wgmma (S = Q K^T from shared memory, O += P V with P in registers) and overlap the
//     softmax of one key tile with the P.V product of the previous one;
//   * mma.sync m16n8k16 (4 warps, 64 rows) for head_dim 64/128/192/256 (192: MLA's unabsorbed
//     prefill, kernels/mla), when wgmma is disabled in the plan, and for fp8 e4m3 pools
//     (head_dim 64/128) the plan does not widen: its codes are copied as they are and widened to
//     the activations' dtype in shared memory (exactly), the K scale folded into the scores, the
//     V scale into O.
// An fp8 pool the plan widens (PagedPrefillPlanInput::total_kv_blocks) runs on the wgmma kernel
// instead: one small kernel first writes the layer's dequantized K / V of the batch's blocks into
// the workspace (code * scale rounded once to the activations' dtype; prefill_fp8_widen.h).
// Both are persistent: a fixed grid from the plan walks the work items, so a captured CUDA
// graph replays with new lengths as long as the plan's bounds hold.
//
// Thread safety: plans are plain values. PagedPrefillAttention is asynchronous on `stream`,
// reads q, the pool and the batch metadata, and writes out and lse (and the workspace when the
// plan widens an fp8 pool).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_PREFILL_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_PREFILL_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/paged_attention.h"

namespace tandem::kernels::cuda {

// Host-known bounds of one step's batch.
struct PagedPrefillPlanInput {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;   // rows of q/out: >= query_start_loc[num_seqs]
  int64_t max_q_len = 1;    // >= every request's q_len
  int64_t max_seq_len = 0;  // >= every request's seq_len
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // 64, 128, 192 or 256
  // bf16 or fp16 (the activations' own dtype), or fp8 e4m3 at head_dim 64/128 (the mma.sync
  // kernel: use_wgmma false); int8 pools are not supported.
  KvDtype kv_dtype = KvDtype::kBf16;
  int num_sms = 132;  // cudaDevAttrMultiProcessorCount of the device
  // head_dim 64/128 run on the Hopper wgmma kernel unless this is false (tests, comparisons);
  // otherwise, and for head_dim 192 / 256, the mma.sync kernel runs.
  bool allow_wgmma = true;
  // Width of V and of the output rows: 0 = head_dim; 128 with head_dim 192 (MLA's unabsorbed
  // prefill, kernels/mla: V rows of the pool keep head_dim values, only the first 128 are read).
  int64_t v_head_dim = 0;
  // fp8 e4m3 pools on the wgmma kernel (allow_wgmma, head_dim 64 / 128): the layer's K / V of
  // the blocks the batch reaches are first widened into a 16-bit copy in the workspace
  // (prefill_fp8_widen.h). That needs the pool's block_size and the batch's blocks,
  // sum over requests of ceil(seq_len / block_size) (host-known: the caller packed the seq_lens),
  // and the copy (Fp8WidenBytes) must fit in fp8_widen_max_bytes; otherwise (either 0, or over)
  // the mma.sync kernel reads the codes directly.
  int64_t kv_block_size = 0;
  int64_t total_kv_blocks = 0;
  int64_t fp8_widen_max_bytes = int64_t{256} << 20;
};

struct PagedPrefillPlan {
  PagedPrefillPlanInput input;
  bool use_wgmma = false;
  // An fp8 pool widened into the workspace for the wgmma kernel (use_wgmma is then true too).
  bool widen_fp8 = false;
  int rows_per_tile = 64;      // query rows (token x group head) per work item
  int64_t num_work_items = 0;  // upper bound: (num_tokens * group / rows + num_seqs) * kv heads
  int grid = 0;                // persistent CTAs
  // 0 unless widen_fp8: the widened layer's K / V and its block table.
  int64_t workspace_bytes = 0;
};

// Picks the kernel and the persistent grid. INVALID_ARGUMENT for non-positive head counts,
// num_q_heads not a multiple of num_kv_heads, head_dim other than 64/128/192/256, v_head_dim
// other than 0 / head_dim / (128 at head_dim 192), a kv_dtype other
// than bf16/fp16/fp8_e4m3 (int8), fp8_e4m3 with head_dim other than 64/128, negative bounds, or
// bounds beyond 2^30 tokens.
absl::StatusOr<PagedPrefillPlan> PlanPagedPrefill(const PagedPrefillPlanInput& input);

// Semantics of cpu::PagedAttention: sequence s has q_len = query_start_loc[s+1] -
// query_start_loc[s] new tokens; its token j sits at position seq_lens[s] - q_len + j and
// attends to [0, pos] (its own new tokens causally; their K/V are already in the pool, written
// by ReshapeAndCache), narrowed to [pos - window_left, pos] by a window, scores scaled and
// optionally soft-capped. A query with no visible key gets out = 0, lse = -inf. NaN in q or in
// a visible K row gives NaN for that (token, head); a NaN V row poisons every row of the key
// tiles that load it (as in FlashAttention). Requests with q_len 0 are skipped.
// `batch` holds DEVICE pointers (query_start_loc, seq_lens, block_tables); its num_seqs and the
// pool geometry must match the plan, and the device values must respect the plan's bounds.
//
// q: [num_tokens, num_q_heads, head_dim] of T; out: [num_tokens, num_q_heads, v_head_dim] of T
// (v_head_dim 0: head_dim); lse: [num_tokens,
// num_q_heads] fp32 natural log, or null. T is __nv_bfloat16 or __half, the pool of the same
// dtype or fp8 e4m3 (KvDtype::kFp8E4m3: element = code * k_scale / v_scale, per tensor or per kv
// head; a NaN code is a NaN element). workspace: plan.workspace_bytes bytes, 256-byte aligned (null
// when 0). q and
// out 16-byte aligned. Rows of out beyond query_start_loc[num_seqs] are not written.
//
// INVALID_ARGUMENT (nothing launched) on: invalid cache view (e.g. an fp8 pool without k_scale
// or v_scale), layer out of range, plan/cache mismatch (kv_dtype included), a pool dtype other
// than T's or fp8_e4m3, scale not finite and > 0, softcap negative or not
// finite, window_left < -1, dcp_size > 1 (decode context parallelism runs on
// cuda::PagedAttention, whatever the q_len), null or unaligned pointers. Batch contents (device
// memory) are NOT validated: they are the caller's contract, as the CPU op checks them.
template <typename T>
absl::Status PagedPrefillAttention(const T* q, const DeviceKvCache& cache, int64_t layer,
                                   const AttentionBatch& batch, const AttentionParams& params,
                                   const PagedPrefillPlan& plan, T* out, float* lse,
                                   void* workspace, cudaStream_t stream);

extern template absl::Status PagedPrefillAttention<__nv_bfloat16>(
    const __nv_bfloat16*, const DeviceKvCache&, int64_t, const AttentionBatch&,
    const AttentionParams&, const PagedPrefillPlan&, __nv_bfloat16*, float*, void*, cudaStream_t);
extern template absl::Status PagedPrefillAttention<__half>(const __half*, const DeviceKvCache&,
                                                           int64_t, const AttentionBatch&,
                                                           const AttentionParams&,
                                                           const PagedPrefillPlan&, __half*, float*,
                                                           void*, cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_PREFILL_CUDA_H_
