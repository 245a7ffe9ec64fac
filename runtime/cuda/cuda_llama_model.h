// The Llama-family decoder (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM; Qwen3 with its
// per-head q/k norms; the MoE models Mixtral, Qwen2-MoE, Qwen3-MoE through CudaMoeMlp,
// cuda_moe_mlp.h) on the CUDA backend: the twin of runtime/cpu/llama_model.h with bf16/fp16
// weights, activations and KV on one device, fp32 accumulation in every op (cuBLASLt GEMMs,
// kernels/layers/cuda/ and kernels/attention/cuda/ kernels).
//
// Per layer: (fused add +) RMSNorm -> qkv GEMM (+bias) -> RoPE in place on the fused qkv rows ->
// KV write (strided k/v rows) -> paged attention -> o_proj -> fused add + RMSNorm -> gate_up ->
// SiLU*up -> down_proj. The residual stream is kept in the activation dtype (as vLLM does).
// Single-row steps (batch-1 decode) run their products on the weight-streaming GEMV with SiLU*up
// folded into the gate_up GEMV (bit-identical to the separate kernels), and launch the GEMVs and
// norms with programmatic dependent launch unless CudaModelOptions::programmatic_launch is off;
// on one GPU their residual adds + RMSNorms run inside the GEMVs too (fold_norm, FoldedLayer).
//
// Forward() only enqueues work on the model's stream (no allocation, no host sync), so a
// runner can capture it in a CUDA graph once every GEMM shape has been seen.
//
// Thread safety: not thread-safe; one runner drives it. Weights are immutable after Create().
#ifndef TANDEM_RUNTIME_CUDA_CUDA_LLAMA_MODEL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_LLAMA_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/cuda/paged_prefill_cuda.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "runtime/cuda/cuda_dcp_exchange.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/cuda/cuda_moe_mlp.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

enum class ActDtype { kBf16, kFp16 };
const char* ActDtypeName(ActDtype dtype);

// One step's metadata, all DEVICE pointers (T tokens, S sequences, R logit rows).
struct DeviceStep {
  const int32_t* token_ids = nullptr;     // [T]
  const int64_t* positions = nullptr;     // [T]
  const int64_t* slot_mapping = nullptr;  // [T]; -1 = do not write
  const int32_t* logit_rows = nullptr;    // [R], indices into [0, T)
  kernels::AttentionBatch attention;      // device query_start_loc / seq_lens / block_tables
  int64_t num_tokens = 0;                 // T
  int64_t num_logit_rows = 0;             // R
};

// The attention kernel of one step, planned once and shared by every layer: the split-KV
// decode kernel (decode, speculative verification, graph-captured steps), or the tensor-core
// prefill kernel for steps with long query runs.
struct StepAttentionPlan {
  bool use_prefill = false;
  kernels::cuda::PagedAttentionPlan decode;
  kernels::cuda::PagedPrefillPlan prefill;
  int64_t workspace_bytes() const {
    return use_prefill ? prefill.workspace_bytes : decode.workspace_bytes;
  }
};

struct CudaModelOptions {
  ActDtype dtype = ActDtype::kBf16;
  // Buffers are sized once for these bounds.
  int64_t max_tokens = 2048;     // T per step
  int64_t max_logit_rows = 256;  // R per step
  // Random weights generated on the device (--load_format=dummy): the values of
  // RandomModelWeights(seed) (runtime/model/dummy_draw.h) rounded to the activation dtype, drawn
  // where they live. The host weights must be empty. `dummy_plan`: what this rank draws
  // (DummyWeightPlan of the whole model's config and the rank's shard: only its slices); empty
  // without a communicator: the whole model of `config`.
  std::optional<uint64_t> dummy_seed;
  std::vector<DummyTensorFill> dummy_plan;
  // The rank's part of a dense 16/32-bit checkpoint read straight into the device buffers
  // (checkpoint_upload.h; the host weights must be empty): the values of LoadModelWeights(
  // checkpoint) rounded to the activation dtype, with no fp32 host copy. UNIMPLEMENTED for MoE
  // and FP8 models (they load through the host).
  std::optional<CheckpointSource> checkpoint;
  // Launch the GEMV and RMSNorm kernels with programmatic dependent launch
  // (kernels/gemm/cuda/gemv_cuda.h): each is scheduled during its predecessor's tail and waits on
  // the device for its output, hiding the launch gap. Same results either way; off for comparisons.
  bool programmatic_launch = true;
  // Batch-1 steps on one GPU (no communicator) of a dense bf16/fp16 model: the residual adds and
  // RMSNorms between the layers' GEMVs are folded into them (kernels/gemm/cuda/gemv_cuda.h:
  // o_proj / down_proj add their product into the residual stream, qkv and gate_up normalise it
  // per CTA): 2 kernels fewer per layer, bit-identical logits. false: separate norm kernels.
  bool fold_norm = true;
  // With fold_norm, and no qk-norm (Qwen3): the qkv GEMV also applies RoPE and writes k / v into
  // the pool and q for attention in its epilogue (kernels/gemm/cuda/gemv_cuda.h:
  // SmallMLinearNormInRopeKv), instead of a separate RopeQkvToCache kernel: 1 kernel fewer per
  // layer. Off by default: measured 0.9% slower on an H200 (8B batch 1: the pair-per-warp
  // streaming costs the qkv product more than the kernel it removes; runtime/cuda/BENCHMARKS.md).
  bool fold_rope = false;
  // Qwen3 (config.qk_norm): the per-head q/k RMSNorm runs inside the RoPE + KV-write kernel
  // (kernels/attention/cuda/rope_cache_cuda.h: QkNormRopeQkvToCache, bit-identical to
  // QkHeadRmsNorm + RopeQkvToCache) at every step size: 1 kernel fewer per layer. false: the two
  // kernels (comparisons).
  bool qk_norm_rope = true;
  // With fold_norm, bf16 MoE models (Qwen3-MoE, Mixtral, Qwen2-MoE; not FP8) too: a batch-1 step
  // on one GPU (no communicator, no moe_comm) runs each MoE layer as qkv (input norm in its
  // prologue) -> attention -> o_proj (adds into residual_) -> one RMSNorm -> the MoE MLP, whose
  // combine adds its output into residual_ (CudaMoeMlp::Forward's add_to_out): 1 kernel fewer
  // per layer than the two fused add + RMSNorm kernels, bit-identical logits. false: MoE models
  // keep the unfolded layer (comparisons).
  bool fold_moe = true;
  // With fold_norm, FP8 models too (per-channel / per-tensor e4m3 weights, bf16 activations): a
  // batch-1 step on one GPU multiplies the bf16 activations by the e4m3 weights as they are
  // (W8A16: no activation quantization, whatever the checkpoint's activation scheme; closer to
  // the unquantized model than W8A8, not the same bits) with the norms and SiLU-and-mul folded
  // into the GEMVs (kernels/fp8/fp8_w8a16_gemv_cuda.h; FoldedLayerFp8): 5 kernels fewer a layer.
  // Steps of 2-8 tokens fold too where the multi-token form keeps two CTAs an SM (Llama-3-8B at
  // 2-3 tokens; TANDEM_FP8_W16_TOKENS, FoldsFp8); larger steps keep the W8A8 kernels. false: W8A8
  // at every step size.
  bool fp8_weight_only_fold = true;
  // DeepSeek-V2/V3 (CudaMlaModel) over a 16-bit latent pool: kv_a_layernorm runs inside the
  // kernel that writes the latent into the pool (kernels/mla/mla_cuda.h: MlaWriteLatentNormed,
  // bit-identical to RmsNorm + MlaWriteLatent) at every step size: 1 kernel fewer per layer.
  // FP8 latent pools keep the two kernels. false: the two kernels (comparisons).
  bool mla_norm_in_write = true;
  // With mla_norm_in_write: k_pe's RoPE inside the same write kernel too (MlaLatentRope,
  // bit-identical to MlaRope + the write; q's RoPE stays its own kernel): 1 kernel fewer a layer.
  bool mla_rope_in_write = true;
  // DeepSeek-V2/V3 (CudaMlaModel::FoldsNorms): a batch-1 step on one GPU (16-bit weights, no DCP,
  // MoE models bf16) runs the residual adds + RMSNorms inside the GEMVs as fold_norm does for
  // Llama (the input norm in q_a_proj's / q_proj's and kv_a_proj_with_mqa's prologue, o_proj /
  // down_proj / the MoE combine adding into the residual stream): 2 kernels fewer a dense layer,
  // 1 a MoE layer, bit-identical logits. false: the unfolded layers (comparisons).
  bool mla_fold_norm = true;
  // DeepSeek-V2/V3's latent attention on kernels/mla's 16-row kernel (MlaTmaSchedule::kRows16) for
  // models of <= 16 heads a rank at <= 128 requests (mla_rows16_max_requests), one-token steps and
  // verify passes alike (16-row tiles: a token's rows run the same kernel either way; steps with a
  // prefill chunk run kSerial; MlaPlanInput::rows16_small_batches). DeepSeek-V2-Lite decode steps
  // 1-6% faster on an H200 (kernels/mla/BENCHMARKS.md, fourteenth and seventeenth sessions). Not
  // kSerial's bits (another fp32 order). false: kSerial everywhere (comparisons).
  bool mla_rows16 = true;
  // mla_rows16's request bound; unset: the planner's (MlaPlanInput::rows16_max_requests).
  // TANDEM_MLA_ROWS16_MAX_REQUESTS overrides both for an A/B.
  std::optional<int64_t> mla_rows16_max_requests;
  // Tensor parallelism (a communicator outliving the model; any size, 1 included): the model is
  // the communicator's rank's shard, as the CPU LlamaModel (config: LocalModelConfig; host
  // weights: the rank's slices, or device dummy weights from dummy_plan). Vocab-parallel embedding
  // + all-reduce, all-reduce after o_proj and down_proj, lm_head on the local vocabulary rows +
  // all-gather, on the device through the communicator (NCCL: capturable in graphs; host-staged:
  // not).
  comm::DeviceCommunicator* comm = nullptr;
  // Decode context parallelism (dcp.size > 1; needs `comm`, dcp.size dividing its size, dcp.rank
  // = comm->rank() % dcp.size): as the CPU LlamaModel, the config's heads are the attention
  // slice's, the pool holds this rank's KV shard (the step's slot mapping writes only its tokens;
  // attention.local_seq_lens on the device), and each layer runs shard attention with LSE, one
  // all-to-all of the group and an LSE merge (CudaDcpExchange) before o_proj, whose weights hold
  // the rank's num_attention_heads / dcp.size heads (TpDims::o_heads). Decode-kernel plans only
  // (the prefill kernel has no DCP path).
  kernels::DcpShard dcp;
  // Data-parallel attention with expert parallelism (config.dp_attention; CudaMoeMlp::
  // UseAllToAll): the group's communicator, carrying only the MoE layers' dispatch / combine
  // all-to-alls; `comm` stays null (nothing is split by heads or vocabulary). Capturable only
  // with a dispatch capacity (set_moe_dispatch_capacity).
  comm::DeviceCommunicator* moe_comm = nullptr;
  // --kv_cache_dtype=fp8 (CudaBackendConfig::fp8_kv): CudaMlaModel's latent pool in FP8 with row
  // scales; CudaLlamaModel's K / V pool in e4m3 with one scale per tensor (kv_dtype kFp8E4m3; the
  // RoPE + KV-write kernels and the batch-1 GEMVs' RoPE epilogues quantize, the attention kernels
  // read it).
  bool fp8_kv = false;
};

class CudaLlamaModel {
 public:
  // Uploads `weights` (fp32 host, freed tensor by tensor as they are uploaded) converted on the
  // device to options.dtype, or generates dummy weights, or reads options.checkpoint.
  // INVALID_ARGUMENT for a config the kernels cannot run (head_dim, alignment) or weights that do
  // not match it.
  static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> Create(const ModelConfig& config,
                                                                ModelWeights weights,
                                                                const CudaModelOptions& options,
                                                                cudaStream_t stream);
  ~CudaLlamaModel();

  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const;
  kernels::cuda::KvDtype kv_dtype() const;
  // An FP8 K / V pool's dequantization scales (CudaModelOptions::fp8_kv): device fp32, every
  // layer's K scale, then every layer's V scale: the checkpoint's calibration
  // (LayerWeights::kv_k_scale / kv_v_scale) where it has one, else kFp8KvTensorScale
  // (runtime/engine/kv_layout.h). Null without fp8_kv. The runner's pool view points at layer 0's;
  // each layer runs on LayerKv's.
  const float* kv_scales() const { return kv_scales_.empty() ? nullptr : kv_scales_.get<float>(); }

  // Enqueues the forward over `step` on `stream`: writes new K/V into `cache`, and fp32 logits
  // [R, vocab] into logits(). `plan` must be planned for this step's bounds; `attn_workspace`
  // holds plan.workspace_bytes(). Requires T <= max_tokens, R <= max_logit_rows.
  absl::Status Forward(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                       const StepAttentionPlan& plan, void* attn_workspace, cudaStream_t stream);

  // Data-parallel attention, a step without tokens on this rank: every MoE layer's collectives
  // (and its experts on the rows other ranks send), nothing else. Enqueues on `stream`; the host
  // waits on each layer's counts exchange (none with a dispatch capacity). FAILED_PRECONDITION
  // without options.moe_comm.
  absl::Status ForwardIdle(cudaStream_t stream);
  // With options.moe_comm, for every later Forward / ForwardIdle: the MoE layers' fixed dispatch
  // capacity (CudaMoeMlp::set_dispatch_capacity; 0: the uneven splits). Every rank of a step sets
  // the same value, at least its tokens.
  void set_moe_dispatch_capacity(int64_t capacity) {
    if (moe_ != nullptr) moe_->set_dispatch_capacity(capacity);
  }

  // GEMM plans for m <= max_m first used from now on are chosen by timing (CublasLtGemm::
  // set_autotune_max_m, and CublasLtFp8Gemm's for the FP8 projections); the runner enables it
  // for its padded decode sizes only.
  void set_gemm_autotune_max_m(int64_t max_m) {
    gemm_->set_autotune_max_m(max_m);
    if (fp8_ != nullptr) fp8_->set_gemm_autotune_max_m(max_m);
  }

  // Vocab-parallel greedy steps (tensor parallelism): with set_gather_logits(false) Forward
  // leaves each rank's logits of its vocabulary rows unexchanged (logits() is not written), and
  // GreedyTokens then writes every row's greedy token to `out` ([R] int32, device), exactly
  // SampleTokens' temperature-0 choice, from one all-gather of R 8-byte candidates per rank
  // instead of R x vocab logits (kernels/sampling/shard_argmax.h). `rows`: the step's sampling
  // rows (their vocab_limit). FAILED_PRECONDITION when the logits were gathered.
  bool vocab_parallel() const { return comm() != nullptr && comm()->size() > 1; }
  void set_gather_logits(bool gather) { gather_logits_ = gather; }
  absl::Status GreedyTokens(int64_t R, const kernels::cuda::DeviceSamplingRow* rows, int32_t* out,
                            cudaStream_t stream);

  // True when a step of Tn tokens runs its residual adds + RMSNorms inside the layers' GEMVs
  // (options.fold_norm, no communicator, a dense bf16/fp16 model or with options.fold_moe a bf16
  // MoE model, every dense product on the GEMV; an FP8 dense model with
  // options.fp8_weight_only_fold at 1 token, opt-in a few: FoldsFp8).
  bool FoldsNorms(int64_t Tn) const;
  // True when such a step's qkv GEMV also does RoPE + the KV write (options.fold_rope).
  bool FoldsRope(int64_t Tn) const;
  const float* logits() const { return logits_.get<float>(); }
  const ModelConfig& config() const { return config_; }
  const CudaModelOptions& options() const { return options_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // The MoE layer (its per-expert load counters), or null for a dense model.
  const CudaMoeMlp* moe() const { return moe_.get(); }

 private:
  struct Layer {
    DeviceBuffer input_layernorm, qkv_proj, qkv_bias, o_proj, o_bias, post_attention_layernorm,
        gate_up_proj, gate_up_bias, down_proj, down_bias;
    DeviceBuffer q_norm, k_norm;  // [head_dim] each (config.qk_norm), else empty
    CudaMoeWeights moe;           // MoE layers (config.IsMoeLayer): their MLP instead of gate_up
    // FP8 weights (config.quantization.IsFp8(); cuda_fp8_linear.h): these projections instead of
    // the bf16 qkv_proj / o_proj / gate_up_proj / down_proj buffers, which stay empty.
    CudaFp8Weight qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
  };
  CudaLlamaModel(const ModelConfig& config, const CudaModelOptions& options);
  template <typename T>
  absl::Status ForwardT(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                        const StepAttentionPlan& plan, void* attn_workspace, cudaStream_t stream);
  absl::Status Upload(ModelWeights weights, cudaStream_t stream);
  // kv_scales_ from the host weights' calibration (empty weights: kFp8KvTensorScale everywhere).
  absl::Status SetKvScales(const ModelWeights& weights);
  // `cache` with k_scale / v_scale pointing at layer l's (an FP8 pool; otherwise `cache`).
  kernels::cuda::DeviceKvCache LayerKv(const kernels::cuda::DeviceKvCache& cache, int64_t l) const;
  // Layer l's FP8 projections from the loader's *_fp8 slots (FP8 configs).
  absl::Status UploadFp8(LayerWeights* src, Layer* dst);
  // Allocates layer l's FP8 projections for device dummy weights (FP8 configs).
  absl::Status AllocateFp8(Layer* l);
  // The FP8 weight a dummy fill of (slot, layer) lands in, or null (not FP8 / not a projection).
  CudaFp8Weight* Fp8Slot(WeightSlot slot, int64_t layer);
  // One projection, out = a . w^T (+ bias): the bf16/fp16 weight `dense` (GEMV or cuBLASLt) or,
  // when `fp8` is not empty, the FP8 path (CudaFp8Linear; bf16 activations only).
  // fp8_codes_ready: a's per-token codes are already in fp8_'s workspace (FusesFp8Quant).
  template <typename T>
  absl::Status Project(const DeviceBuffer& dense, const CudaFp8Weight& fp8, const T* a,
                       const DeviceBuffer& bias, int64_t m, int64_t n, int64_t k, T* out,
                       cudaStream_t stream, bool fp8_codes_ready = false);
  // True when the producer of `fp8`'s input (RMSNorm or SiLU-and-mul over rows of `width`)
  // writes its codes itself (kernels/fp8/fp8_fused_quant_cuda.h): an FP8 weight taking per-token
  // codes (RMSNorm also 1 x 128 groups: `silu` false), bf16, and no all-reduce before the norm
  // (`reduce`; TP > 1 keeps the separate pass).
  bool FusesFp8Quant(const CudaFp8Weight& fp8, int64_t Tn, int64_t width, bool reduce,
                     bool silu = false) const;
  // ReduceAddNorm without the reduce, its output also quantized into fp8_'s codes as `fp8`
  // quantizes its input.
  absl::Status AddNormQuantFp8(bool add, const DeviceBuffer& weight, const CudaFp8Weight& fp8,
                               int64_t Tn, float eps, cudaStream_t stream);
  // act_ = SiLU(gate) * up of gate_up_ as per-token codes in fp8_'s workspace (no bf16 act_).
  absl::Status SiluAndMulQuantFp8(const CudaFp8Weight& fp8, int64_t Tn, cudaStream_t stream);
  // The rank's weight buffers, sized as Upload() checks them, zero-filled on `stream`.
  absl::Status AllocateWeights(cudaStream_t stream);
  absl::Status GenerateDummy(uint64_t seed, cudaStream_t stream);
  absl::Status LoadCheckpoint(const CheckpointSource& source, cudaStream_t stream);
  // The device buffer a dummy fill lands in (null when the model has no such buffer).
  DeviceBuffer* SlotBuffer(WeightSlot slot, int64_t layer);
  absl::Status AllocateActivations();
  // Layer `l`'s attention of the step (q_ ready): attn_, or with DCP this rank's heads merged
  // over every shard. Returns o_proj's input.
  template <typename T>
  absl::StatusOr<const T*> Attention(const DeviceStep& step,
                                     const kernels::cuda::DeviceKvCache& cache, int64_t l,
                                     const StepAttentionPlan& plan, void* attn_workspace,
                                     cudaStream_t stream);
  // hidden_ = RMSNorm(residual_) with `weight` over Tn rows, after residual_ += hidden_ (`add`;
  // without: residual_ as it is, the embedding rows). `reduce`: the input (hidden_, or residual_
  // without the add) holds this rank's partial sums, all-reduced first: one fused kernel where
  // the communicator has one for the shape (comm/custom_all_reduce.h), else all-reduce + norm.
  template <typename T>
  absl::Status ReduceAddNorm(bool reduce, bool add, const T* weight, int64_t Tn, float eps,
                             cudaStream_t stream);
  // qk-norm (Qwen3), RoPE + KV write and layer l's attention on the step's qkv_; returns
  // o_proj's input (Attention).
  template <typename T>
  absl::StatusOr<const T*> AttendFromQkv(const DeviceStep& step,
                                         const kernels::cuda::DeviceKvCache& cache, int64_t l,
                                         const StepAttentionPlan& plan, void* attn_workspace,
                                         cudaStream_t stream);
  // Layer l with the residual add + RMSNorm folded into its GEMVs (cuda_llama_model_fold.cc):
  // residual_ holds the residual stream before and after (the embedding before layer 0).
  template <typename T>
  absl::Status FoldedLayer(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                           int64_t l, const StepAttentionPlan& plan, void* attn_workspace,
                           cudaStream_t stream);
  // Layer l's RoPE + KV-write arguments for the folded qkv GEMVs (SmallMLinearNormInRopeKv,
  // Fp8W16GemvNormInRopeKv): the step's positions and slots, the pool geometry, q written to q_out.
  kernels::cuda::GemvRopeKv RopeKvArgs(const DeviceStep& step,
                                       const kernels::cuda::DeviceKvCache& cache, int64_t l,
                                       void* q_out) const;
  // FoldedLayer for FP8 weights (cuda_llama_model_fp8.cc; options.fp8_weight_only_fold).
  absl::Status FoldedLayerFp8(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                              int64_t l, const StepAttentionPlan& plan, void* attn_workspace,
                              cudaStream_t stream);
  // FoldsNorms for an FP8 model: fp8_weight_only_fold, bf16, every projection on the weight-only
  // GEMV; 1 token, or 2 to kFp8W16TokensMaxM on its multi-token form (TANDEM_FP8_W16_TOKENS:
  // auto, the default, where every projection keeps two CTAs an SM, Llama-3-8B 2-3 tokens; 1:
  // batch 1 only; N: up to N).
  bool FoldsFp8(int64_t Tn) const;
  // out [R, vocab rows] fp32 = last_'s R rows . lm_head_fp8_^T (config.quantization.lm_head;
  // cuda_llama_model_fp8.cc): R = 1 on the weight-only GEMV (Fp8W16Gemv, fp32 out, as the
  // batch-1 projections; where fp8_weight_only_fold), else CudaFp8Linear (the projections'
  // scheme) into lm_head_out_ [R, vocab rows] bf16, widened.
  absl::Status LmHeadFp8(int64_t R, float* out, cudaStream_t stream);
  // Sums `n` activations (device, the activation dtype) over the communicator.
  absl::Status AllReduce(void* data, int64_t n, cudaStream_t stream);
  // The vocab-parallel logits: local [R, vocab_rows_] -> gathered [ranks, R, vocab_rows_] ->
  // logits_ [R, vocab] (one strided copy per rank, the padding past vocab dropped).
  absl::Status GatherLogits(int64_t R, cudaStream_t stream);
  comm::DeviceCommunicator* comm() const { return options_.comm; }

  const ModelConfig config_;
  const CudaModelOptions options_;
  int64_t vocab_rows_ = 0;        // embedding / lm_head rows this rank holds
  int64_t vocab_begin_ = 0;       // the first one's vocabulary id
  DeviceBuffer local_logits_;     // [R, vocab_rows_] fp32 (communicator only)
  DeviceBuffer gathered_logits_;  // [ranks, R, vocab_rows_] fp32 (communicator only)
  bool gather_logits_ = true;     // set_gather_logits

  std::unique_ptr<kernels::cuda::CublasLtGemm> gemm_;
  DeviceBuffer embed_tokens_, norm_, lm_head_;  // lm_head_ empty when tied or FP8
  CudaFp8Weight lm_head_fp8_;  // config_.quantization.lm_head: [vocab_rows_, hidden] e4m3
  DeviceBuffer lm_head_out_;   // with lm_head_fp8_: [max_logit_rows, vocab_rows_] bf16
  std::vector<Layer> layers_;
  DeviceBuffer inv_freq_;   // [head_dim / 2] fp32
  DeviceBuffer kv_scales_;  // fp8_kv: [2][num_layers] fp32 (kv_scales())
  // Activations, [max_tokens, *] of the activation dtype; logits_ [max_logit_rows, vocab] fp32.
  DeviceBuffer hidden_, residual_, qkv_, q_, attn_, gate_up_, act_, last_, logits_;
  std::unique_ptr<CudaDcpExchange> dcp_exchange_;  // DCP only: lse, exchange and merged buffers
  std::unique_ptr<CudaMoeMlp> moe_;                // MoE models: routing + expert scratch
  std::unique_ptr<CudaFp8Linear> fp8_;             // FP8 configs: activation codes + GEMM
  int64_t weight_bytes_ = 0;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_LLAMA_MODEL_H_
