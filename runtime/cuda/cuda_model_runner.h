// The CUDA backend's ModelExecutor: owns the device KV pool, the model, one compute stream and
// the per-step metadata buffers; runs one scheduled step per Run().
//
// Per step: the batch metadata (token ids, positions, slot mapping, query_start_loc, seq_lens,
// block tables with a fixed stride, logit rows, sampling rows) is packed into one pinned buffer
// and copied with ONE host-to-device copy; the attention plan is built once and shared by every
// layer; sampling runs on the device; only the sampled tokens (and captured prompt logits)
// come back.
//
// Decode steps (every sequence has exactly one new token, at most the largest graph size) are
// padded to the nearest graph batch size (padding sequences have q_len 0 and slot -1, so they
// read and write nothing) and run as a CUDA graph captured on first use for that size. With
// graphs disabled the same padded step runs eagerly, so graph-captured and uncaptured decode
// compute bit-identical logits. Speculative verify passes (each sequence its last token and its
// k >= 0 drafts) are padded the same way, each sequence to 1 + the step's largest k token slots,
// and replayed from graphs keyed by (size, width) (CudaBackendConfig::verify_graphs).
//
// Decode context parallelism (CudaBackendConfig::dcp_size > 1), as the CPU ModelRunner: the
// scheduler's block tables hold group-wide block ids (runtime/kv_cache/dcp_blocks.h: id x lives
// on shard x % dcp at local block x / dcp); the runner packs this shard's blocks as local ids,
// gives slot -1 to the tokens of other shards and uploads local_seq_lens with the metadata. Every
// step then runs on the decode kernel (the prefill kernel has no DCP path).
//
// Speculative decoding with DeepSeek's MTP layer (runtime/engine/mtp_proposer.h): a batch with
// return_hidden_states gets every fed token's final hidden state (after the final norm; MLA models)
// in RunnerOutput::hidden_states, copied back after the step; CreateMtp builds the runner of the
// MTP layer itself (CudaMtpModel on a latent pool of its own, one rank), which takes the batch's
// input_hidden (uploaded before the step, so its decode steps run as graphs too), feeds token id
// -1 (a zero embedding) at position 0 and returns its own output y as hidden_states.
//
// Errors: every launch is checked; a CUDA error fails the step with its converted Status.
// Thread safety: not thread-safe; called from the engine's step loop. The device is made
// current on the calling thread in Run().
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MODEL_RUNNER_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MODEL_RUNNER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/device_communicator.h"
#include "comm/process_group.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/dcp_shard.h"
#include "runtime/cuda/cuda_llama_model.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/cuda_mtp_model.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/engine/model_executor.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime::cuda {

struct CudaBackendConfig {
  int device = 0;
  ActDtype dtype = ActDtype::kBf16;
  // Used when EngineConfig::kv_cache_bytes is 0: the KV pool takes this fraction of the
  // device's free memory, minus the weights and a 2 GiB activation/workspace reserve.
  double gpu_memory_utilization = 0.9;
  bool enable_cuda_graphs = true;
  // Speculative verify passes (every sequence feeds its last token and its k >= 0 drafts,
  // k = 0 for a sequence that does not speculate, some k > 0) are padded like decode steps: the
  // sequences to the graph batch size, each to w = 1 + the step's largest k tokens (padding
  // tokens write nothing, their rows are not read back), and replayed as graphs keyed by (size,
  // w); with enable_cuda_graphs false the same padded step runs eagerly (bit-identical). false:
  // verify passes run eagerly and unpadded (the comparison baseline).
  bool verify_graphs = true;
  // Data-parallel attention (--dp_attention): when every DP rank's part of a step decodes,
  // every rank (an idle one too, as padding sequences) pads to the graph size of the step's
  // largest DP batch (SchedulerOutput::dp_decode_seqs), the MoE layers dispatch at that fixed
  // capacity (CudaMoeMlp::set_dispatch_capacity: no counts read-back) and the step replays as a
  // CUDA graph. false: every DP step eager and unpadded with the read-back (the A/B baseline).
  bool dp_attention_graphs = true;
  // Time cuBLASLt's candidate algorithms once per padded decode size (CublasLtGemm::
  // set_autotune_max_m; CublasLtFp8Gemm's too, for FP8 projections at m > 16). The choice depends
  // on timings, so two processes may pick different algorithms (and round differently); false:
  // cuBLASLt's first heuristic choice, reproducible. Off by default: on the H200 it did not change
  // the Llama-3-8B decode step (5.11 vs 4.97 ms at batch 1, within noise).
  bool gemm_autotune = false;
  // Steps with a query run of >= kPrefillMinQLen tokens use the tensor-core prefill kernel
  // (head_dim 64/128/256); false: the decode kernel serves every step (comparisons).
  bool use_prefill_kernel = true;
  // The prefill kernel's Hopper (wgmma) variant for head_dim 64/128 (2-2.5x the mma.sync one on
  // the H200); false: its mma.sync one.
  bool prefill_allow_wgmma = true;
  // FP8 K / V pools (--kv_cache_dtype=fp8) on the wgmma prefill kernel: a prefill step's
  // layer K / V of the blocks it reaches are widened to 16 bits in the attention workspace
  // first, when that copy (4 KiB a token at 8 kv heads x 128) fits this many bytes; larger steps
  // (or 0) run the mma.sync kernel over the codes. Allocated when the runner is created, and
  // taken out of the default KV budget (gpu_memory_utilization) besides its 2 GiB reserve.
  int64_t prefill_fp8_widen_max_bytes = int64_t{256} << 20;
  // The paged decode kernel merges its KV splits itself (the last split CTA of each group;
  // PagedAttentionPlanInput::workspace_zeroed) in a decode workspace of its own, zeroed when it
  // is allocated and kept zero by the kernel; false: a second (PDL) kernel merges them, in the
  // workspace the prefill kernel shares. Bit-identical results either way. Off by default: on the
  // H200 it did not speed up the Llama-3-8B decode step (kernels/attention/cuda/BENCHMARKS.md).
  bool decode_merge_in_kernel = false;
  // The decode kernel's split CTAs of one (request, kv head) form a thread-block cluster and
  // merge their splits through distributed shared memory (PagedAttentionPlanInput::
  // cluster_merge; taken where valid and every cluster fits in one wave, else the merge above).
  // Bit-identical to both merges. Unset (the default): on for models with FP8 weights, off for
  // 16-bit ones. On an H200 Llama-3-8B FP8 batch-1 steps gained 1-2% at 1k - 16k (sixteenth
  // session) and 0.6-3% (thirty-third, with and without an FP8 lm_head: 2.544 -> 2.471 ms at 1k),
  // bf16 ones gained nothing and lost 0.5-1% at 4k / 16k (the clusters pack up to 4 CTAs an SM;
  // the kernel alone is 24% slower at 1 x 16k; kernels/attention/cuda/BENCHMARKS.md, sixteenth
  // session; kernels/fp8/BENCHMARKS.md, thirty-third). TANDEM_DECODE_CLUSTER_MERGE=1 / 0
  // overrides it.
  std::optional<bool> decode_cluster_merge;
  // Decode batch sizes captured as graphs (sorted, capped at max_num_seqs). Empty: the default
  // 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256.
  std::vector<int64_t> graph_batch_sizes;
  // Random weights generated on the device (the engine is then given empty host weights); with
  // a group, `dummy_plan` says which slices this rank draws (CudaModelOptions::dummy_plan).
  std::optional<uint64_t> dummy_seed;
  std::vector<DummyTensorFill> dummy_plan;
  // A dense 16/32-bit checkpoint's rank part read straight into device memory (the engine is
  // then given empty host weights; CudaModelOptions::checkpoint, checkpoint_upload.h).
  std::optional<CheckpointSource> checkpoint;
  // A tensor-parallel rank: its group's host ProcessGroup (outliving the runner; any size, 1
  // included). The runner builds the device communicator over it (CudaModelOptions::comm):
  // tp_comm "nccl" (one GPU per rank; graphs stay on) or "gloo" (host-staged, for ranks sharing
  // a GPU; graphs off). Creating the runner is then collective over the group.
  comm::ProcessGroup* group = nullptr;
  std::string tp_comm = "nccl";
  // Deadline of the communicator's init and of every step's collectives (NCCL).
  absl::Duration comm_timeout = absl::Seconds(30);
  // NCCL: small all-reduces on the custom one-shot / two-shot kernels where the group allows
  // (comm/custom_all_reduce.h); false: NCCL only (comparisons).
  bool custom_all_reduce = true;
  // With the custom all-reduce: each all-reduce fused with the residual add + RMSNorm after it
  // where it takes the one-shot path (NcclCommunicatorOptions::fuse_all_reduce_norm; bit-identical
  // to the unfused pair). On by default: on nvidia-h200-x4 it made the Llama-3-8B / 70B decode
  // step 1.3-4.9% faster at batch 1 and 8 (TP=2 and 4) and left batch 64 unchanged
  // (runtime/cuda/BENCHMARKS.md).
  bool fuse_all_reduce_norm = true;
  // The custom all-reduce kernels launch with programmatic dependent launch (with
  // programmatic_launch; NcclCommunicatorOptions::custom_all_reduce_pdl); false: comparisons.
  bool custom_all_reduce_pdl = true;
  // Tensor parallelism: steps of at least this many logit rows whose sampled rows are all greedy
  // gather one (value, id) candidate per rank and row instead of the rows' whole logits
  // (CudaLlamaModel::GreedyTokens); 0: never. 64: where it measured faster (nvidia-h200-x2,
  // 8B TP=2: batch 64 -2.3%, batch 8 equal, batch 1 +1.4%: runtime/cuda/BENCHMARKS.md).
  int64_t vocab_parallel_greedy_min_rows = 64;
  // CudaModelOptions::programmatic_launch (PDL for the batch-1 GEMVs and the norms).
  bool programmatic_launch = true;
  // With programmatic_launch: the paged decode kernel is PDL-launched behind the kernel that
  // writes q and the new KV rows (PagedAttentionPlanInput::programmatic_launch), so its launch and
  // its first block-table loads overlap that kernel's tail; false: comparisons.
  bool decode_attention_pdl = true;
  // CudaModelOptions::fold_norm: batch-1 steps on one GPU (no group) of dense bf16/fp16 Llama-
  // family models run the residual add + RMSNorm inside their GEMVs (bit-identical logits).
  bool fold_norm = true;
  // CudaModelOptions::fold_rope: with fold_norm, RoPE + the KV write in the qkv GEMV's epilogue
  // (off: measured slower, runtime/cuda/BENCHMARKS.md).
  bool fold_rope = false;
  // CudaModelOptions::qk_norm_rope: Qwen3's per-head q/k RMSNorm inside the RoPE + KV-write
  // kernel (bit-identical to the two kernels).
  bool qk_norm_rope = true;
  // CudaModelOptions::fold_moe: with fold_norm, bf16 MoE models' batch-1 steps on one GPU fold
  // too (o_proj and the MoE combine add into the residual stream; bit-identical logits).
  bool fold_moe = true;
  // CudaModelOptions::fp8_weight_only_fold: with fold_norm, batch-1 steps of FP8 models on one
  // GPU run W8A16 (bf16 activations, no activation quantization) with the norms folded in.
  bool fp8_weight_only_fold = true;
  // CudaModelOptions::mla_norm_in_write: DeepSeek-V2/V3's kv_a_layernorm inside the latent-write
  // kernel over a 16-bit latent pool (bit-identical to the two kernels).
  bool mla_norm_in_write = true;
  // CudaModelOptions::mla_rope_in_write: with mla_norm_in_write, k_pe's RoPE in that kernel too.
  bool mla_rope_in_write = true;
  // CudaModelOptions::mla_fold_norm: DeepSeek-V2/V3's batch-1 steps on one GPU with the residual
  // adds + RMSNorms inside the GEMVs (bit-identical logits).
  bool mla_fold_norm = true;
  // CudaModelOptions::mla_rows16: small-batch MLA attention on the 16-row kernel.
  bool mla_rows16 = true;
  // CudaModelOptions::mla_rows16_max_requests: the largest batch it runs on (unset: the planner's).
  std::optional<int64_t> mla_rows16_max_requests;
  // Decode context parallelism over `group` (ExecutorFactory::dcp_size / dcp_interleave): KV
  // shards per attention slice (dividing the group's size; this rank is shard group->rank() %
  // dcp_size) and tokens per unit (0: the block size).
  int64_t dcp_size = 1;
  int64_t dcp_interleave = 0;
  // --kv_cache_dtype=fp8, kv_dtype kFp8E4m3: a DeepSeek MLA model's latent pool in FP8 with row
  // scales (runtime/engine/kv_layout.h, Fp8LatentPool; kernels/mla MlaWriteLatentFp8 and the FP8
  // read), or a GQA model's K / V pool in e4m3 with one scale per tensor and layer: the
  // checkpoint's calibrated k / v scales where it has them, else kFp8KvTensorScale
  // (runtime/engine/kv_layout.h; CudaLlamaModel::kv_scales; kernels/attention/cuda
  // kv_cache_cuda.h: RopeQkvToCache quantizes, the decode and prefill kernels dequantize).
  bool fp8_kv = false;
};

// The CUDA backend for Engine::Create. The KV pool is device memory in the activation dtype
// (kv_dtype bf16 or fp16, the activation dtype; or FP8, fp8_kv); external
// (host) pools are not accepted.
ExecutorFactory CudaExecutorFactory(const CudaBackendConfig& config);

class CudaModelRunner : public ModelExecutor {
 public:
  static constexpr int64_t kPrefillMinQLen = 16;

  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(const CudaBackendConfig& config,
                                                                 const ExecutorSpec& spec,
                                                                 ModelWeights weights);
  // The runner of a DeepSeek MLA target's MTP layer (spec.model_config: the target's; `config`
  // one rank: no group or DCP, host weights). Its steps need SchedulerOutput::input_hidden.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> CreateMtp(const CudaBackendConfig& config,
                                                                    const ExecutorSpec& spec,
                                                                    MtpWeights weights);
  ~CudaModelRunner() override;

  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override;
  void* kv_pool_data() override { return pool_.data(); }
  int64_t kv_pool_bytes() const override { return pool_.bytes(); }
  bool pool_on_device() const override { return true; }

  ExecutorStats stats() const override { return stats_; }
  // The communicator's first failure (a dead or wedged rank), else OK.
  absl::Status health() const override {
    return comm_ == nullptr ? absl::OkStatus() : comm_->status();
  }
  const CudaLlamaModel& model() const { return *model_; }

 private:
  // Byte offsets of the packed metadata arrays (capacities fixed at creation).
  struct MetaLayout {
    int64_t token_ids, positions, slot_mapping, query_start_loc, seq_lens, local_seq_lens,
        logit_rows, sampling_rows, block_tables, total;
  };
  CudaModelRunner(const CudaBackendConfig& config, const ExecutorSpec& spec);
  // Create's body: `make_model` builds the runner's model for the options and returns its KV
  // layout; the pool and the step metadata follow.
  using ModelMaker = std::function<absl::StatusOr<kernels::KvCacheLayout>(
      CudaModelRunner* runner, const CudaModelOptions& options)>;
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Build(const CudaBackendConfig& config,
                                                                const ExecutorSpec& spec,
                                                                const ModelMaker& make_model);
  // Build's steps after the model: the KV pool of `layout` (cache_), then the packed step
  // metadata, sampling workspace and sampled-token buffers.
  absl::Status AllocatePool(const kernels::KvCacheLayout& layout);
  absl::Status AllocateStepBuffers();
  // cuda_model_runner_hidden.cc. The MTP runner: the batch's input_hidden onto the device before
  // the step (INVALID_ARGUMENT when missing or misshapen; and for other runners when given).
  absl::Status UploadInputHidden(const SchedulerOutput& batch, int64_t num_tokens);
  // return_hidden_states: enqueues the copy of the step's `num_tokens` hidden rows to the host
  // (UNIMPLEMENTED for a Llama-family model), and after the stream synchronized, widens them into
  // out->hidden_states.
  absl::Status EnqueueHiddenCopy(const SchedulerOutput& batch, int64_t num_tokens);
  void TakeHidden(const SchedulerOutput& batch, int64_t num_tokens, RunnerOutput* out) const;
  // cuda_model_runner_verify.cc. Rejection sampling on the device for the step's verify passes
  // whose drafts came with their distributions (ScheduledSeq::draft_probs, a draft model's
  // sampling requests): after the step's forward, the target's distributions of the pass's rows
  // (kernels/sampling/cuda TokenProbabilities), the drafts' uploaded, RejectionSampleDrafts and
  // the results' copy back are enqueued; TakeRejection then rewrites those sequences' samples as
  // the engine's CPU verifier would (the accepted drafts, then the residual sample or the bonus
  // token). `padded`: the step was padded (every sequence has logit rows).
  absl::Status EnqueueRejection(const SchedulerOutput& batch, bool padded);
  void TakeRejection(const SchedulerOutput& batch, RunnerOutput* out) const;

  // Packs `batch` (padded to `padded_seqs` sequences of `width` token slots each when > 0: width 1
  // for decode, 1 + the largest draft count for a verify pass) into the pinned buffer.
  // Returns the host-side step description (device pointers into meta_dev_). max_seq_len: the
  // longest context this rank's pool holds (its shard's under DCP: it only sizes the splits).
  DeviceStep Pack(const SchedulerOutput& batch, int64_t padded_seqs, int64_t width,
                  int64_t* max_q_len, int64_t* max_seq_len, int64_t* copy_bytes);
  // The padded step's token width: 1 for a decode step, 1 + the largest draft count for a verify
  // pass that fits a graph size (config_.verify_graphs), 0 for a step that runs unpadded. Sets
  // *padded_seqs (the graph size) when the width is > 0.
  int64_t PaddedWidth(const SchedulerOutput& batch, int64_t* padded_seqs) const;
  // Data-parallel attention: the padded sequences every DP rank runs this step (the graph size
  // of SchedulerOutput::dp_decode_seqs; of this rank's own batch when that is -1), 0: eager.
  int64_t DpPaddedSeqs(const SchedulerOutput& batch) const;
  // Data-parallel attention: whether this runner is a DP rank whose model (CudaLlamaModel or
  // CudaMlaModel) dispatches its MoE rows over comm_; its MoE layers' dispatch capacity for the
  // next steps; a step without sequences (every MoE layer's collectives, uneven splits).
  bool DpMoe() const;
  void SetMoeDispatchCapacity(int64_t capacity);
  absl::Status DpIdleStep();
  // Data-parallel attention graphs: whether any rank of the group captures a graph this step
  // (`mine`: this rank does); one all-reduce of a flag read back (capture runs the step's
  // collectives twice: eagerly, then from the graph; every rank must run them as often).
  absl::StatusOr<bool> AnyRankCaptures(bool mine);
  // Writes `table` (a request's scheduler block table) as this rank's pool sees it into `row`
  // (its shard's blocks as local ids under DCP).
  void PackBlockTable(absl::Span<const BlockId> table, int32_t* row) const;
  // The decode kernel's plan, or the prefill kernel's when max_q_len >= kPrefillMinQLen and the
  // head_dim has a prefill kernel (never for graph steps: allow_prefill = false). total_kv_blocks:
  // the step's blocks, sum of ceil(seq_len / block_size) (an fp8 pool's prefill widening).
  absl::StatusOr<StepAttentionPlan> Plan(int64_t num_seqs, int64_t num_tokens, int64_t max_q_len,
                                         int64_t max_seq_len, int64_t total_kv_blocks,
                                         bool allow_prefill) const;
  // Grows the workspace `plan` runs in (attn_workspace_ or, for a decode plan that merges its
  // splits in the kernel, decode_workspace_, zeroed when allocated) to its workspace_bytes();
  // growing drops the captured graphs.
  absl::Status EnsureAttnWorkspace(const StepAttentionPlan& plan);
  // The workspace `plan` runs in (see EnsureAttnWorkspace).
  void* AttnWorkspace(const StepAttentionPlan& plan);
  // Enqueues forward + sampling for `step` (what a graph captures). `greedy` (GreedyOnly): the
  // tokens from the vocab-parallel candidates (CudaLlamaModel::GreedyTokens), no logits gather.
  absl::Status Enqueue(const DeviceStep& step, const StepAttentionPlan& plan, bool greedy);
  // The graph of a padded step of step.attention.num_seqs sequences of `width` tokens (and
  // `greedy`), captured on first use (the metadata for `step` must already be on the device).
  absl::StatusOr<cudaGraphExec_t> GraphFor(const DeviceStep& step, const StepAttentionPlan& plan,
                                           int64_t width, bool greedy);
  // Destroys every captured graph (they hold buffer addresses that are about to change).
  void DropGraphs();
  // True when the model's logits are vocab-parallel (TP > 1), the step has at least
  // config_.vocab_parallel_greedy_min_rows (> 0) logit rows, and every row the step's sequences
  // use is greedy (temperature 0) with no prompt logits captured: the full logits are then
  // never needed.
  bool GreedyOnly(const SchedulerOutput& batch, int64_t num_logit_rows) const;
  int64_t GraphSizeFor(int64_t num_seqs) const;
  // The forward and the logits of whichever model the config needs (model_ or mla_model_).
  absl::Status ModelForward(const DeviceStep& step, const StepAttentionPlan& plan);
  const float* ModelLogits() const;

  const CudaBackendConfig config_;
  const ExecutorSpec spec_;
  int64_t max_blocks_per_seq_ = 0;  // block-table stride: ceil(max_model_len / block_size)
  int64_t max_tokens_ = 0, max_seqs_ = 0, max_rows_ = 0;
  int num_sms_ = 0;
  kernels::DcpShard dcp_;  // size 1: no decode context parallelism
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<comm::DeviceCommunicator> comm_;  // before model_: the model uses it
  std::unique_ptr<CudaLlamaModel> model_;           // null for an MLA model ...
  std::unique_ptr<CudaMlaModel> mla_model_;         // ... which runs this one (DeepSeek-V2/V3)
  std::unique_ptr<CudaMtpModel> mtp_model_;         // ... or this one (CreateMtp)
  DeviceBuffer input_hidden_;                       // MTP: fp32 [max_tokens, hidden]
  PinnedBuffer hidden_host_;                        // hidden_states rows (activation dtype)
  DeviceBuffer pool_;
  kernels::cuda::DeviceKvCache cache_;
  MetaLayout meta_{};
  PinnedBuffer meta_host_;
  DeviceBuffer meta_dev_;
  DeviceBuffer attn_workspace_, sample_workspace_, sampled_dev_;
  // The decode kernel's own workspace under decode_merge_in_kernel: its first
  // kPagedAttentionCounterBytes (the split counters) must stay zero between calls, so nothing
  // else (the prefill kernel) may write it.
  DeviceBuffer decode_workspace_;
  PinnedBuffer sampled_host_;
  DeviceBuffer capture_flag_dev_;  // AnyRankCaptures: one fp32
  PinnedBuffer capture_flag_host_;
  std::vector<int64_t> graph_sizes_;
  // By (padded size, token width, greedy).
  std::map<std::tuple<int64_t, int64_t, bool>, cudaGraphExec_t> graphs_;
  // The padded decode steps' plans by (padded size, token width): fixed for the runner's life
  // (the grid must not depend on a step's lengths), so planned once each, which keeps the
  // cluster merge's occupancy query and attribute calls off every later step's host path.
  std::map<std::pair<int64_t, int64_t>, StepAttentionPlan> padded_plans_;
  ExecutorStats stats_;
  // Device rejection sampling (cuda_model_runner_verify.cc), grown on demand, outside graphs.
  struct RejectionPassOf {
    int64_t seq;  // the batch's sequence index
    int64_t k;    // its drafts
  };
  std::vector<RejectionPassOf> rejection_passes_;  // this step's, in launch order
  DeviceBuffer target_probs_dev_, draft_probs_dev_, rejection_meta_dev_, rejection_workspace_;
  PinnedBuffer draft_probs_host_, rejection_meta_host_, rejection_out_host_;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MODEL_RUNNER_H_
