// CUDA multi-head latent attention (DeepSeek-V2/V3 MLA) over the paged latent KV cache: the device
// twin of mla_attention.h's absorbed path, with the latent-row write.
//
// Pool: a DeviceKvCache whose layout is the latent layout (num_planes 1, num_kv_heads 1, head_dim
// D = kv_lora_rank + qk_rope_head_dim), bf16 or fp16; row = [c_kv (L) | k_pe (Dr)].
//
// Absorbed attention, three steps (MlaAbsorbedAttention runs all of them):
//   1. MlaAbsorbQuery: q_cat[t, h] = [W_UK_h^T q_nope[t, h] | q_pe[t, h]]  ([T, Hq, D]); one
//      cuBLAS strided-batched GEMM over the heads (fp32 accumulation) plus a strided copy of q_pe,
//      or at one token a GEMV (MlaAbsorbOptions).
//   2. MlaLatentAttention: every head attends over the shared latent rows (576-wide keys, the
//      512-wide c_kv as values for DeepSeek-V3), o_lat [T, Hq, L] and the natural-log LSE.
//      FlashMLA's design: a CTA owns 64 (query token x head) rows of one request, streams that
//      request's latent rows through shared memory once for all of them (cp.async ring), scores
//      and P.V on tensor cores (fp32 accumulators, online softmax): on sm_90 by wgmma (two
//      warpgroups, 64-latent tiles; the default: TMA loads, mla_decode_tma.cu, where the page
//      size suits, else cp.async, mla_decode_wgmma.cu), elsewhere or with
//      allow_wgmma = false by mma.sync m16n8k16 (8 warps, 32-latent tiles). Contexts are split
//      over `plan.num_splits` CTAs per row tile (split-KV: each request's own context in chunks
//      of >= 64 latents, 512 when planned, MlaPlan::num_splits); the fp32 partials are merged by
//      LSE with cuda::MergeF32AttnStatesN, or by the TMA kernel itself (MlaPlan::merge_in_kernel).
//      q_len > 1 (speculative verification, chunked prefill) is causal per row. Latent widths other
//      than 512 + 64 run a plain CUDA-core kernel (one warp per row; the tiny test models), same
//      semantics.
//   3. MlaUnabsorbOutput: out[t, h] = W_UV_h o_lat[t, h] ([T, Hq, Dv]); one strided-batched GEMM
//      (at one token a GEMV, as step 1).
// kv_b_proj: [Hq * (Dn + Dv), L] (torch Linear layout; rows h*(Dn+Dv) .. +Dn are W_UK_h).
//
// Semantics are cpu::MlaPagedAttention's (kAbsorbed): query token i of a request with q_len new
// tokens and seq_lens[s] = ctx sits at position ctx - q_len + i and sees latents [0, position];
// a row with no visible latent gets out 0, lse -inf. bf16/fp16 rounding happens where the device
// stores: q_cat, the P weights fed to the tensor cores, o_lat.
//
// CUDA graphs: no allocation, no synchronization; the grid depends only on the plan, so a
// captured step replays with new lengths inside the plan's bounds. cuBLAS needs a handle bound to
// `stream` (the calls set it: cublasSetStream) and, for capture, a workspace (cublasSetWorkspace).
//
// Thread safety: plans are plain values; the calls are asynchronous on `stream` and write only
// their outputs and the workspace.
#ifndef TANDEM_KERNELS_MLA_MLA_CUDA_H_
#define TANDEM_KERNELS_MLA_MLA_CUDA_H_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/cuda/paged_prefill_cuda.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/mla/mla_attention.h"

namespace tandem::kernels::cuda {

// How the two warpgroups of the TMA latent kernel share a 64-latent tile (BENCHMARKS.md: the
// measured differences).
enum class MlaTmaSchedule {
  // mla_decode_tma.cu: warpgroup 0 scores and runs the softmax, hands P over, both add P V for
  // their 256 output columns; both wait for both at the hand-over and at the stage's release.
  kSerial,
  // The same work, warpgroup 0 not waiting for warpgroup 1's P V: it scores the next tile under
  // it (each hand-over waited for one way only).
  kHandOff,
  // mla_decode_seesaw.cu, FlashMLA's "seesaw": tiles in pairs, each warpgroup scores one of them
  // and the softmax of one runs under the other's wgmma; both stages are held for the pair.
  kSeesaw,
  // mla_decode_rows16.cu (issue 33): row tiles of 16 rows (models of <= 16 heads; more heads run
  // kSerial) without wgmma's padding to 64 rows: mma.sync m16n8k16, 8 warps, Q in registers, the
  // same TMA tiles (three stages), workspace and in-kernel merge.
  kRows16,
};

// Host-known bounds of one step's batch.
struct MlaPlanInput {
  MlaDims dims;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;   // rows of q / out (>= query_start_loc[num_seqs])
  int64_t max_q_len = 1;    // >= every request's q_len
  int64_t max_seq_len = 0;  // >= every request's seq_len
  int num_sms = 132;        // cudaDevAttrMultiProcessorCount
  // 0: choose (tensor-core kernels: the splits that minimize a modelled time, about one wave of
  // one CTA per SM at small batches, each split >= 64 latents at max_seq_len; plain kernel: about
  // one wave); >= 1: at most this many (and at most 256, and ceil(max_seq_len / 64)). Each CTA
  // splits its own request's context (MlaPlan::num_splits), so a plan for a long bound (a CUDA
  // graph's max_model_len) keeps short requests spread over SMs in chunks of >= 64 latents.
  int num_splits = 0;
  // > 0: fewer splits until plan.workspace_bytes fits (one split always does when it is at least
  // the unsplit workspace of num_tokens).
  int64_t max_workspace_bytes = 0;
  // Latent 512 + 64, bf16 / fp16 pool, on an sm_90 device: the wgmma kernel
  // (mla_decode_wgmma.cu); false: the mma.sync one (A/B). Other devices run mma.sync either way.
  // An FP8 pool: the Hopper FP8 kernel (mla_decode_fp8.cu); false: the plain kernel.
  bool allow_wgmma = true;
  // With the wgmma kernel: its TMA variant (mla_decode_tma.cu: TMA loads with per-chunk
  // mbarriers) where the pool's page size suits it (8, 16, 32 or a multiple of 64 latents); false:
  // the cp.async variant (A/B, and every other page size).
  bool allow_tma = true;
  // With the TMA variant: its warpgroup schedule (MlaTmaSchedule).
  MlaTmaSchedule tma_schedule = MlaTmaSchedule::kSerial;
  // Decode context parallelism (dcp_shard.h; size 1: none): the pool and the block tables hold
  // only this shard's latents at local indices, AttentionBatch::seq_lens (and so every query
  // position) stay global; a query at global position p sees the shard's latents before p + 1
  // (DcpLocalCount(p + 1)), so q_len > 1 stays causal. max_seq_len bounds the LOCAL lengths (it
  // sizes the splits). The output is this shard's partial with its LSE (a query that sees none of
  // the shard's latents: out 0, lse -inf), merged across shards by LSE (CudaDcpExchange).
  DcpShard dcp = {};
  // The caller zeroed the workspace's first kMlaMergeCounterBytes once (at allocation) and keeps
  // them for this purpose: the workspace layout then starts with them (every plan, split or not,
  // so plans of any shape can share the workspace), and the TMA kernel (kSerial / kHandOff)
  // merges its own splits (MlaPlan::merge_in_kernel): the last CTA of each (request, row tile) to
  // finish merges every split's partial and writes o_lat (and lse) itself, no merge or convert
  // launch; an atomic ticket per group that the merging CTA resets, so CUDA-graph replays and
  // later calls find the counters zero. false: the separate MergeF32AttnStatesN.
  bool workspace_zeroed = false;
  // With tma_schedule kSerial and no forced splits: kRows16 instead for models of <= 16 heads
  // (per rank) at <= rows16_max_requests requests and max_q_len <= kMlaAbsorbMaxQueryLen (16-row
  // tiles: a verify pass's token runs the same kernel as a one-token step; a step with a prefill
  // chunk keeps kSerial).
  bool rows16_small_batches = false;
  // rows16_small_batches' request bound (a step's num_seqs). 8 while kRows16 lost 3-5% to kSerial
  // at 16 requests; since its Q staging and cluster merge it is faster at every batch measured on
  // an H200 (BENCHMARKS.md, seventeenth session: 16 heads, 16 .. 128 requests x 512 .. 4k, kernel
  // -1 to -27%; DeepSeek-V2-Lite decode steps at 16 / 32 / 64 requests -1.3 / -1.4 / -4.1%), so
  // the bound is the largest batch measured. CudaModelOptions::mla_rows16_max_requests overrides.
  int64_t rows16_max_requests = 128;
  // The TMA kernel (kSerial / kHandOff), a variant for A/B (default 0: off): each CTA also
  // prefetches into L2 (TMA prefetch, no shared memory) the latents of the tiles up to this many
  // past its two stages, so a latency-bound CTA (small batch: one tile's load per tile's math)
  // has more of its latents in flight. At most 16.
  // kRows16 has no such variant: a plan asking for it runs kSerial.
  int tma_l2_prefetch_tiles = 0;
  // kRows16 only (issue 33, an A/B, default off): the kernel is launched with programmatic
  // dependent launch (PDL) and does before griddepcontrol.wait what does not depend on the kernel
  // before it in the stream: barrier init, tensor-map prefetch, the request's qsl / seq_lens /
  // block-table reads, and the TMA loads of its first stages where those tiles lie wholly below
  // the positions this step writes (local positions < seq_len - q_len). Q, every store, the merge
  // tickets come after the wait. REQUIRES: nothing the preceding kernel (or one still running
  // before it) writes is read before the wait: qsl, seq_lens, block tables and the older
  // latents are written before that kernel (or by kernels already complete).
  bool prewait = false;
  // kRows16 only (an A/B, default off): the split CTAs of one merge group (request, row tile)
  // form one thread-block cluster (cluster rank = split) and merge the group's splits through
  // distributed shared memory (cluster_merge.cuh's ClusterMergeSplits, bit-identical to the
  // in-kernel merge): each CTA keeps its fp32 partial in its own shared memory, no workspace
  // partials, no tickets. The cluster has plan.num_splits CTAs for every group: a request whose
  // context fills fewer of them merges empty splits (LSE -inf, o 0) from the rest. Taken only
  // where valid (MlaPlan::cluster_merge); otherwise the plan keeps today's merge.
  bool cluster_merge = false;
  // With cluster_merge: take it only where every cluster of the grid is resident at once (a
  // second wave of clusters made 16 x 4k 49% slower, BENCHMARKS.md); false (tests) takes it
  // wherever it is valid.
  bool cluster_merge_one_wave = true;
  // An FP8 latent pool planned on kRows16: its FP8 kernel (mla_decode_rows16_fp8.cu, the codes on
  // the fp16 mma); false: the 64-row FP8 wgmma kernel (mla_decode_fp8.cu), an A/B.
  bool rows16_fp8 = true;
  // Measurement only (mla_cuda_bench --phases=1; null: off): the TMA kernels (kSerial /
  // kHandOff / kRows16) write per-CTA phase stamps here (mla_phase_stamps.h: kMlaStampWords
  // uint64 a CTA of the grid (num_splits, row_tiles, num_seqs), zeroed by the caller).
  unsigned long long* phase_stamps = nullptr;
};

// The merge tickets' range at the start of a workspace_zeroed workspace (one uint32 per
// (request, row tile): num_seqs x row_tiles <= 4096 for the in-kernel merge).
inline constexpr int64_t kMlaMergeCounterBytes = 16384;

struct MlaPlan {
  MlaPlanInput input;
  bool use_mma = false;    // the tensor-core kernel (latent 512 + 64) rather than the plain one
  bool use_wgmma = false;  // use_mma && allow_wgmma: the Hopper variant where the device has it
  bool use_tma = false;    // use_wgmma && allow_tma: its TMA loads where the page size suits
  MlaTmaSchedule tma_schedule = MlaTmaSchedule::kSerial;  // use_tma: input.tma_schedule
  // CTAs per (request, row tile) along the context. The CTAs of a request whose rows see `keys`
  // latents take chunks of ceil(keys / num_splits) rounded up to 64 (whole tiles of every
  // kernel), and at least split_min_latents: its own context, not max_seq_len, is split; CTAs
  // past its end only mark their partial empty.
  int num_splits = 1;
  // 512 where the planner chose num_splits (shorter splits measured no faster), 64 where
  // MlaPlanInput::num_splits forced it.
  int split_min_latents = 64;
  // num_splits > 1, input.workspace_zeroed, the TMA kernel, num_seqs x row_tiles <= 4096: the
  // kernel merges its splits (MlaPlanInput::workspace_zeroed); where the TMA kernel does not run
  // after all (page size, device) the separate merge does, in the same workspace layout.
  bool merge_in_kernel = false;
  // input.cluster_merge taken: kRows16 with 2..16 splits (one cluster size for every group:
  // num_splits) where cudaOccupancyMaxActiveClusters of that cluster is > 0 on the current device.
  // false where asked but invalid (other schedule, 1 or > 16 splits, no device or no room): the
  // plan then merges as without it (merge_in_kernel or the separate merge).
  bool cluster_merge = false;
  // Why input.cluster_merge was not taken (a string literal), or null.
  const char* cluster_merge_fallback = nullptr;
  int64_t row_tiles = 0;        // ceil(max_q_len * Hq / 64); kRows16: / 16
  int64_t workspace_bytes = 0;  // [counters] + q_cat + o_lat (+ fp32 partials, LSE when split)
};

// INVALID_ARGUMENT for invalid dims, D not a multiple of 8, L > 1024, negative or inconsistent
// bounds, an invalid DCP shard.
absl::StatusOr<MlaPlan> PlanMla(const MlaPlanInput& input);

// Writes latent rows into plane 0 of `layer`: row t = [c_kv[t, 0..L) | k_pe[t, 0..Dr)] at slot
// slot_mapping[t] (-1: skipped). c_kv / k_pe rows `*_stride` elements apart (device). T matches
// the pool (bf16 / fp16). INVALID_ARGUMENT unless the cache is a latent cache of width L + Dr.
template <typename T>
absl::Status MlaWriteLatent(const T* c_kv, int64_t c_kv_stride, const T* k_pe, int64_t k_pe_stride,
                            const int64_t* slot_mapping, int64_t num_tokens, const MlaDims& dims,
                            const DeviceKvCache& cache, int64_t layer, cudaStream_t stream);

// MlaWriteLatent with the kv_a_layernorm of the c_kv rows fused in: row t = [RmsNorm(c_kv[t, 0..L))
// | k_pe[t, 0..Dr)] at slot slot_mapping[t] (-1: skipped), the norm bit-identical to
// kernels/layers/cuda's RmsNorm(c_kv, norm_weight, L, eps) (fp32, its reduction order, rounded
// once to T) followed by MlaWriteLatent; one kernel instead of two. c_kv rows c_kv_stride elements
// apart (a multiple of 8), c_kv and norm_weight 16-byte aligned. 16-bit pools only (an FP8 pool:
// RmsNorm then MlaWriteLatentFp8). INVALID_ARGUMENT as MlaWriteLatent, and unless
// MlaWriteLatentNormedSupported(dims).
// rope (optional): k_pe is rotated on its way into the pool, bit-identical to MlaRope(positions,
// num_tokens, inv_freq, Dr, attention_factor, interleave, k_pe, 1, k_pe_stride, 0) before the
// write (the same fp32 angle, fp64 sincos rounded to fp32, products and rounding); k_pe itself is
// not modified. positions / inv_freq on the device, as MlaRope's.
struct MlaLatentRope {
  const int64_t* positions = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr;     // [Dr / 2]
  float attention_factor = 1.0f;
  bool interleave = false;
};
inline constexpr int64_t kMlaWriteNormMaxLora = 2048;  // RmsNorm's one-vector-per-thread rows
inline bool MlaWriteLatentNormedSupported(const MlaDims& dims) {
  return dims.kv_lora_rank > 0 && dims.kv_lora_rank % 8 == 0 &&
         dims.kv_lora_rank <= kMlaWriteNormMaxLora;
}
template <typename T>
absl::Status MlaWriteLatentNormed(const T* c_kv, int64_t c_kv_stride, const T* norm_weight,
                                  float eps, const T* k_pe, int64_t k_pe_stride,
                                  const int64_t* slot_mapping, int64_t num_tokens,
                                  const MlaDims& dims, const DeviceKvCache& cache, int64_t layer,
                                  cudaStream_t stream, const MlaLatentRope* rope = nullptr);

// MlaWriteLatent into an FP8 latent pool (mla_fp8_latent.h's format: `cache` of dtype kFp8E4m3
// holding e4m3 codes, cache.token_scales one fp32 scale per (token, layer) row at [e / D]; or,
// with cache.latent_block_bytes > 0, each block its codes then its scales, one range);
// k_scale / v_scale unused): each row quantized with scale = max|row| / 448 (1 for a zero row),
// bit-exactly cpu::WriteLatentCacheFp8 of the same (T-valued) latents. One warp per token.
// MlaLatentAttention / MlaAbsorbedAttention read such a pool: for latent 512 + 64 on sm_90 through
// the Hopper FP8 kernel (mla_decode_fp8.cu: codes dequantized into bf16 / fp16 tiles in shared
// memory, then wgmma), elsewhere (or allow_wgmma = false) through the plain kernel (codes times the
// row's scale).
template <typename T>
absl::Status MlaWriteLatentFp8(const T* c_kv, int64_t c_kv_stride, const T* k_pe,
                               int64_t k_pe_stride, const int64_t* slot_mapping, int64_t num_tokens,
                               const MlaDims& dims, const DeviceKvCache& cache, int64_t layer,
                               cudaStream_t stream);

// DeepSeek's decoupled RoPE on the device, exactly cpu::ApplyMlaRope (mla_attention.h): for t in
// [0, num_tokens), r in [0, rows_per_token), the rope_dim values at x + (t * rows_per_token + r) *
// row_stride + offset rotate by positions[t] * inv_freq[i] (fp32 product; cos / sin in fp64,
// rounded to fp32, times attention_factor); interleaved pairs or rotate-half. positions:
// [num_tokens] int64 and inv_freq [rope_dim / 2] fp32 on the device; x rounded once to T.
template <typename T>
absl::Status MlaRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                     int64_t rope_dim, float attention_factor, bool interleave, T* x,
                     int64_t rows_per_token, int64_t row_stride, int64_t offset,
                     cudaStream_t stream);

// How steps 1 and 3 run. One-token steps (batch-1 decode; at most `gemv_max_tokens` tokens) run
// weight-streaming GEMVs over the heads (mla_absorb_gemv_cuda.cu: every weight byte read from HBM
// once), longer ones (prefill, verification, batches) cuBLAS's strided-batched GEMM, whose tiles
// fill with the tokens: from 2 tokens on cuBLAS is as fast or faster (kernels/mla/BENCHMARKS.md,
// "Twenty-ninth session": mla_absorb_cuda_bench). The GEMVs need L % 8 == 0, Dn <= 256 and
// 16-byte aligned operands, else cuBLAS runs.
struct MlaAbsorbOptions {
  static constexpr int64_t kDefaultGemvMaxTokens = 1;
  int64_t gemv_max_tokens = kDefaultGemvMaxTokens;  // 0: cuBLAS always (the bench's baseline)
  // A programmatic dependent launch (PDL) of the GEMVs: each CTA issues its first weight loads
  // (which never depend on the predecessor) before griddepcontrol.wait, then reads the
  // activations. Off: a plain launch (the same arithmetic, bit-identical results).
  bool pdl = false;
};

// Step 1. q: [T, Hq, Dn + Dr]; q_cat: [T, Hq, D].
template <typename T>
absl::Status MlaAbsorbQuery(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                            const MlaDims& dims, int64_t num_tokens, T* q_cat, cudaStream_t stream,
                            const MlaAbsorbOptions& options = {});

// Step 2. q_cat: [T, Hq, D]; o_lat: [T, Hq, L]; lse: [T, Hq] or null. `batch` holds DEVICE
// pointers; bounds as planned. workspace: plan.workspace_bytes (only the split partials are
// used here). An FP8 latent pool (see MlaWriteLatentFp8) runs the Hopper FP8 kernel where it can,
// else the plain one. Under
// plan.input.dcp the result is this shard's partial (MlaPlanInput::dcp); `lse` is then needed to
// merge it.
template <typename T>
absl::Status MlaLatentAttention(const T* q_cat, const DeviceKvCache& cache, int64_t layer,
                                const AttentionBatch& batch, float scale, const MlaPlan& plan,
                                void* workspace, T* o_lat, float* lse, cudaStream_t stream);

// Step 3. o_lat: [T, Hq, L]; out: [T, Hq, Dv].
template <typename T>
absl::Status MlaUnabsorbOutput(cublasHandle_t cublas, const T* o_lat, const T* kv_b_proj,
                               const MlaDims& dims, int64_t num_tokens, T* out, cudaStream_t stream,
                               const MlaAbsorbOptions& options = {});

// Steps 1-3 with q_cat and o_lat in `workspace` (plan.workspace_bytes, 256-byte aligned).
// q: [T, Hq, Dn + Dr] (q_pe rotated); out: [T, Hq, Dv]; lse: [T, Hq] or null.
template <typename T>
absl::Status MlaAbsorbedAttention(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                                  const DeviceKvCache& cache, int64_t layer,
                                  const AttentionBatch& batch, float scale, const MlaPlan& plan,
                                  void* workspace, T* out, float* lse, cudaStream_t stream,
                                  const MlaAbsorbOptions& absorb = {});

// ---- Unabsorbed prefill (mla_unabsorbed_cuda.cu) ----
// The form vLLM runs long prefills in: every request's whole latent context (prefix and new
// tokens, already written) is gathered from the pages and up-projected once through kv_b_proj into
// per-head keys [k_nope | k_pe] (Dqk = Dn + Dr) and values (Dv, in rows of Dqk): two cuBLAS
// strided-batched GEMMs over the heads writing straight into a block-size-1 K/V pool; then
// ordinary causal MHA over those rows by kernels/attention/cuda's PagedPrefillAttention (the
// mma.sync kernel at head_dim Dqk with V of Dv; its wgmma kernel stops at 128). Semantics and
// outputs are MlaAbsorbedAttention's (out [T, Hq, Dv], LSE for chunked-prefill merges). Per
// (query, key) pair it spends Dqk + Dv multiply-adds where the absorbed form spends (L + Dr) + L
// (320 vs 1088 for DeepSeek), at the price of the context's
// up-projection (2 L Hq (Dn + Dv) flops per latent) and a workspace of ~2 Hq Dqk values per
// context token. Which wins at which shape: BENCHMARKS.md, mla_prefill_select.h.
// Only bf16 / fp16 latent pools, no DCP, Dqk = Dv in {64, 128, 192, 256} or Dqk 192 with Dv 128
// (DeepSeek), L and Dn multiples of 8. Not graph-capturable (prefill steps only): the GEMMs' row
// count is the plan's context bound.
struct MlaUnabsorbedPlan {
  MlaPlanInput input;
  int64_t max_context_tokens = 0;  // >= the sum of the requests' seq_lens (host bound)
  int64_t head_dim = 0;            // Dqk: the width of the up-projected K and V rows
  PagedPrefillPlan prefill;        // the attention over the up-projected rows
  int64_t workspace_bytes = 0;     // context starts, block table, c_kv rows, K/V
};

// INVALID_ARGUMENT for dims the route does not take (above), a DCP shard, bounds out of range
// (num_seqs > 65535, max_context_tokens < max_seq_len or > 2^30).
absl::StatusOr<MlaUnabsorbedPlan> PlanMlaUnabsorbed(const MlaPlanInput& input,
                                                    int64_t max_context_tokens);

// q: [T, Hq, Dn + Dr] (q_pe rotated); out: [T, Hq, Dv]; lse: [T, Hq] or null; `batch` holds
// DEVICE pointers within the plan's bounds (sum of seq_lens <= max_context_tokens: not checked,
// device memory). workspace: plan.workspace_bytes, 256-byte aligned.
template <typename T>
absl::Status MlaUnabsorbedAttention(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                                    const DeviceKvCache& cache, int64_t layer,
                                    const AttentionBatch& batch, float scale,
                                    const MlaUnabsorbedPlan& plan, void* workspace, T* out,
                                    float* lse, cudaStream_t stream);

#define TANDEM_MLA_CUDA_EXTERN(T)                                                                  \
  extern template absl::Status MlaWriteLatent<T>(const T*, int64_t, const T*, int64_t,             \
                                                 const int64_t*, int64_t, const MlaDims&,          \
                                                 const DeviceKvCache&, int64_t, cudaStream_t);     \
  extern template absl::Status MlaWriteLatentFp8<T>(const T*, int64_t, const T*, int64_t,          \
                                                    const int64_t*, int64_t, const MlaDims&,       \
                                                    const DeviceKvCache&, int64_t, cudaStream_t);  \
  extern template absl::Status MlaWriteLatentNormed<T>(                                            \
      const T*, int64_t, const T*, float, const T*, int64_t, const int64_t*, int64_t,              \
      const MlaDims&, const DeviceKvCache&, int64_t, cudaStream_t, const MlaLatentRope*);          \
  extern template absl::Status MlaRope<T>(const int64_t*, int64_t, const float*, int64_t, float,   \
                                          bool, T*, int64_t, int64_t, int64_t, cudaStream_t);      \
  extern template absl::Status MlaAbsorbQuery<T>(cublasHandle_t, const T*, const T*,               \
                                                 const MlaDims&, int64_t, T*, cudaStream_t,        \
                                                 const MlaAbsorbOptions&);                         \
  extern template absl::Status MlaLatentAttention<T>(const T*, const DeviceKvCache&, int64_t,      \
                                                     const AttentionBatch&, float, const MlaPlan&, \
                                                     void*, T*, float*, cudaStream_t);             \
  extern template absl::Status MlaUnabsorbOutput<T>(cublasHandle_t, const T*, const T*,            \
                                                    const MlaDims&, int64_t, T*, cudaStream_t,     \
                                                    const MlaAbsorbOptions&);                      \
  extern template absl::Status MlaAbsorbedAttention<T>(                                            \
      cublasHandle_t, const T*, const T*, const DeviceKvCache&, int64_t, const AttentionBatch&,    \
      float, const MlaPlan&, void*, T*, float*, cudaStream_t, const MlaAbsorbOptions&);            \
  extern template absl::Status MlaUnabsorbedAttention<T>(                                          \
      cublasHandle_t, const T*, const T*, const DeviceKvCache&, int64_t, const AttentionBatch&,    \
      float, const MlaUnabsorbedPlan&, void*, T*, float*, cudaStream_t);
TANDEM_MLA_CUDA_EXTERN(__nv_bfloat16)
TANDEM_MLA_CUDA_EXTERN(__half)
#undef TANDEM_MLA_CUDA_EXTERN

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MLA_MLA_CUDA_H_
