// The DeepSeek-V2/V3 decoder (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM: multi-head latent
// attention) on the CUDA backend: the twin of runtime/cpu/mla_model.h with bf16/fp16 weights,
// activations and a latent KV pool on one device, fp32 accumulation in every op.
//
// Per layer: (fused add +) RMSNorm -> q (q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj) ->
// kv_a_proj_with_mqa as two products (c_kv rows, k_pe rows) -> kv_a_layernorm on c_kv -> RoPE
// on q_pe and k_pe (kernels/mla MlaRope: interleaved or rotate-half, YaRN factor) -> latent
// write (a 16-bit pool with options.mla_norm_in_write: kv_a_layernorm inside the write kernel,
// MlaWriteLatentNormed, bit-identical) -> absorbed MLA over the paged latent cache (kernels/mla
// MlaAbsorbedAttention, every q_len: decode, verification and prefill alike) -> o_proj -> fused add
// + RMSNorm -> dense SwiGLU MLP, or from first_k_dense_replace on DeepSeek's MoE layer (CudaMoeMlp,
// cuda_moe_mlp.h: V2 group-limited / V3 noaux_tc routing, shared experts). The softmax scale is
// DeepSeek's (Dn + Dr)^-0.5 times YaRN's mscale^2.
// A one-token step (batch-1 decode) runs every 16-bit product on the weight-streaming GEMV
// (dense_linear.h; kv_a_proj_with_mqa as one product, q_a_layernorm inside q_b_proj's GEMV,
// SiLU*up inside gate_up's; kernels/mla's absorption GEMVs) instead of cuBLAS, whose tiles idle
// at one row; on one GPU (options.mla_fold_norm: FoldsNorms, FoldedLayer) with the residual adds
// + RMSNorms inside the GEMVs as CudaLlamaModel's FoldedLayer (bit-identical).
//
// Tensor parallelism (options.comm; config = the rank's LocalModelConfig), as the CPU MlaModel:
// each rank runs its Hq/N heads (its rows of q_proj / q_b_proj and kv_b_proj, its o_proj
// columns) over the WHOLE latent (q_a / kv_a replicated), so every rank caches the same latent
// rows; the dense MLP and the experts are sliced; vocab-parallel embedding + all-reduce, an
// all-reduce after o_proj and after the MLP, lm_head on the local vocabulary rows + all-gather.
// Device dummy weights (options.dummy_seed): drawn on the device from DummyWeightPlan, each rank
// only its slices (runtime/model/dummy_draw.h); an FP8 config's projections and experts drawn
// and quantized on the device as the host quantizes its draw (QuantizeWeightsFp8).
//
// Decode context parallelism (options.dcp, as the CPU MlaModel and CudaLlamaModel): the slice's
// ranks hold token shards of the latent (the runner writes each latent on its shard only, at a
// local index); each rank attends its shard for all the slice's heads (kernels/mla with
// MlaPlanInput::dcp: partial + LSE, causal by global position), then one all-to-all of the group
// and the LSE merge (CudaDcpExchange, the GQA exchange) hand o_proj this rank's Hq / dcp heads
// (TpDims::o_heads). Not with an FP8 latent pool (refused by name).
//
// Forward() only enqueues work on the stream (no allocation, no host sync), so the runner can
// capture it in a CUDA graph once every GEMM shape has been seen.
//
// Thread safety: not thread-safe; one runner drives it. Weights are immutable after Create().
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MLA_MODEL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MLA_MODEL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/cuda/cuda_llama_model.h"
#include "runtime/cuda/cuda_moe_mlp.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

class CudaMlaModel {
 public:
  // Uploads `weights` (fp32 host, freed tensor by tensor) converted to options.dtype.
  // INVALID_ARGUMENT for weights that do not match the config or a DCP shard that does not fit
  // the communicator and heads; UNIMPLEMENTED for DCP over an FP8 latent pool.
  static absl::StatusOr<std::unique_ptr<CudaMlaModel>> Create(const ModelConfig& config,
                                                              ModelWeights weights,
                                                              const CudaModelOptions& options,
                                                              cudaStream_t stream);
  ~CudaMlaModel();

  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const;
  kernels::cuda::KvDtype kv_dtype() const;

  // Enqueues the forward over `step`: writes the new latents into `cache` and fp32 logits [R,
  // vocab] into logits(). The step's bounds come from plan.decode.input (num_seqs, num_tokens,
  // max_q_len, max_seq_len); the MLA workspace is the model's own (attn_workspace unused).
  absl::Status Forward(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                       const StepAttentionPlan& plan, void* attn_workspace, cudaStream_t stream);

  // Data-parallel attention with expert parallelism (options.moe_comm; CudaMoeMlp::UseAllToAll),
  // as CudaLlamaModel: the rank runs attention, the dense MLPs and lm_head whole for its own
  // sequences; the MoE layers dispatch rows to their experts' ranks and combine them back.
  // ForwardIdle: a step without tokens on this rank (every MoE layer's collectives, nothing
  // else); FAILED_PRECONDITION without options.moe_comm. set_moe_dispatch_capacity: the MoE
  // layers' fixed dispatch capacity for every later step (0: the uneven splits), the same on
  // every rank of a step.
  absl::Status ForwardIdle(cudaStream_t stream);
  void set_moe_dispatch_capacity(int64_t capacity) {
    if (moe_ != nullptr) moe_->set_dispatch_capacity(capacity);
  }

  // As CudaLlamaModel's: the bf16 GEMM and the FP8 projections' cuBLASLt FP8 GEMM.
  void set_gemm_autotune_max_m(int64_t max_m) {
    gemm_->set_autotune_max_m(max_m);
    if (fp8_ != nullptr) fp8_->set_gemm_autotune_max_m(max_m);
  }
  // MTP (cuda_mtp_model.h): Forward takes its input rows [T, hidden] from `embeds` (a device
  // buffer of the activation dtype, read when Forward runs, also from a captured graph) instead
  // of embedding step.token_ids; null: the embedding (the default). One rank only.
  void set_input_embeds(const void* embeds) { input_embeds_ = embeds; }
  // After Forward: every fed token's final hidden state, [T, hidden] of the activation dtype:
  // after the final norm (what the MTP layer is fed), or before it (the residual stream).
  const void* normed_hidden() const { return hidden_.data(); }
  const void* hidden_before_norm() const { return residual_.data(); }
  const DeviceBuffer& embed_tokens() const { return embed_tokens_; }
  const float* logits() const { return logits_.get<float>(); }
  const ModelConfig& config() const { return config_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // True when a step of Tn tokens runs the folded layer (options.mla_fold_norm; a batch-1 step on
  // one GPU, 16-bit weights, no DCP, not the MTP block, every product on the GEMV; MoE models
  // bf16 without expert placement; cuda_mla_model_fold.cc): the input RMSNorm inside the first
  // products' GEMVs, o_proj / down_proj / the MoE combine adding into residual_; bit-identical.
  bool FoldsNorms(int64_t Tn) const;

 private:
  struct Layer {
    DeviceBuffer input_layernorm, q_a_proj, q_a_layernorm, q_proj, kv_a_proj, kv_a_layernorm,
        kv_b_proj, o_proj, post_attention_layernorm, gate_up_proj, down_proj;
    CudaMoeWeights moe;  // MoE layers (config.IsMoeLayer): their MLP instead of gate_up / down
    // FP8 checkpoints (cuda_mla_model_fp8.cc): the e4m3 projections, the 16-bit buffers above
    // then empty; kv_a_proj_with_mqa as its c_kv rows and its k_pe rows.
    CudaFp8Weight q_a_fp8, q_fp8, kv_a_c_fp8, kv_a_pe_fp8, o_fp8, gate_up_fp8, down_fp8;
  };
  // One device tensor of the rank (not the MoE layers'): where it goes, the checkpoint slot a
  // dummy fill names, its host source (null for dummy weights) and its element count.
  struct Tensor {
    DeviceBuffer* dst;
    WeightSlot slot;
    int64_t layer;  // -1: model-level
    std::vector<float>* host;
    int64_t numel;
    const char* name;
  };
  CudaMlaModel(const ModelConfig& config, const CudaModelOptions& options);
  // Every tensor of the rank (sizes from the local config and vocab_rows_); sizes layers_.
  std::vector<Tensor> Tensors(ModelWeights* host);
  absl::Status Upload(ModelWeights weights, cudaStream_t stream);
  absl::Status GenerateDummy(uint64_t seed, cudaStream_t stream);
  // FP8 checkpoints (cuda_mla_model_fp8.cc): the layer's e4m3 projections onto the device.
  absl::Status UploadFp8(LayerWeights* src, Layer* dst);
  // kv_a_proj_with_mqa [L + Dr, hidden] as its c_kv rows and its k_pe rows (freed).
  absl::Status UploadKvA(Fp8LinearWeight* kv_a, Layer* dst);
  // Device dummy weights of an FP8 config (cuda_mla_model_fp8.cc): every layer's e4m3
  // projections allocated (zero), then each fill of an FP8 projection drawn and quantized as
  // the host's QuantizeWeightsFp8 (true; false for another fill): kv_a_proj_with_mqa drawn whole
  // then split as UploadFp8 splits a checkpoint's, kv_b_proj quantized and widened into its
  // 16-bit buffer. `staging`: the fp32 draw, grown as needed.
  absl::Status AllocateFp8Dummy();
  absl::StatusOr<bool> FillFp8DummyProjection(const DummyTensorFill& fill, uint64_t seed,
                                              DeviceBuffer* staging, cudaStream_t stream);
  // out [m, n] = a [m, k] . w^T: the FP8 weight `fp8` where it is set (CudaFp8Linear, bf16 only),
  // else the 16-bit `w` (DenseLinear: the GEMV for one row, else cuBLASLt). fp8_codes_ready: a's
  // codes are already in fp8_'s workspace (SharesFp8Codes), no quantization pass.
  template <typename T>
  absl::Status Project(const CudaFp8Weight& fp8, const T* w, const T* a, int64_t m, int64_t n,
                       int64_t k, T* out, cudaStream_t stream, bool fp8_codes_ready = false);
  // True when `next`, multiplying the same m rows right after `first`, can take the codes
  // first's CudaFp8Linear call quantized into fp8_'s workspace: both FP8 with the same dynamic
  // scheme (per token or 1 x 128 groups) and width, and first's call quantizing (TakesTokenCodes:
  // not the batch-1 W8A16 GEMV). q_proj and kv_a_proj_with_mqa's two parts read the same normed
  // hidden rows.
  bool SharesFp8Codes(const CudaFp8Weight& first, const CudaFp8Weight& next, int64_t m) const;
  // Sums `n` activations over the communicator; the vocab-parallel logits local -> logits_.
  absl::Status AllReduce(void* data, int64_t n, cudaStream_t stream);
  absl::Status GatherLogits(int64_t R, cudaStream_t stream);
  comm::DeviceCommunicator* comm() const { return options_.comm; }
  absl::Status Allocate(int64_t num_sms);
  // unabsorbed_workspace_ / unabsorbed_rows_ where the form applies (cuda_mla_model.cc: sized
  // for 2 x max_tokens context rows, at most 512 MiB).
  absl::Status AllocateUnabsorbed(int64_t max_tokens);
  // The step's unabsorbed plan when the cost model prefers it and the workspace holds it.
  absl::StatusOr<std::optional<kernels::cuda::MlaUnabsorbedPlan>> ChooseUnabsorbed(
      const kernels::cuda::MlaPlanInput& in, cudaStream_t stream) const;
  template <typename T>
  absl::Status ForwardT(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                        const kernels::cuda::MlaPlan& plan, cudaStream_t stream);
  // hidden_ (normed) -> q_ [T, Hq, Dn + Dr] (q_pe not yet rotated), ckv_normed_ [T, L] (with
  // norm_in_write: c_kv left un-normed in ckv_ [T, L], for MlaWriteLatentNormed) and the k_pe
  // rows [T, Dr] it returns: kpe_, or right after the one token's c_kv in ckv_ when
  // kv_a_proj_with_mqa ran as one GEMV (cuda_mla_model_proj.cc). fold (FoldsNorms): the first
  // products read residual_ with the input RMSNorm in their prologue (SmallMLinearNormIn).
  template <typename T>
  absl::StatusOr<T*> ProjectQKv(const Layer& w, int64_t Tn, bool fold, bool norm_in_write,
                                cudaStream_t stream);
  // hidden_ (normed; fold: residual_ and the input norm in the GEMVs) -> attn_ [T, Hq, Dv].
  template <typename T>
  absl::Status Attention(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                         int64_t l, const kernels::cuda::MlaPlan& plan, bool fold,
                         cudaStream_t stream);
  // Layer l of a FoldsNorms step (cuda_mla_model_fold.cc): residual_ in, residual_ out.
  template <typename T>
  absl::Status FoldedLayer(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                           int64_t l, const kernels::cuda::MlaPlan& plan, cudaStream_t stream);

  // transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps (as the CPU
  // MlaModel).
  static constexpr float kLatentNormEps = 1e-6f;

  const ModelConfig config_;
  const CudaModelOptions options_;
  const kernels::MlaDims dims_;
  const float softmax_scale_;
  const float rope_factor_;
  int64_t vocab_rows_ = 0;        // embedding / lm_head rows this rank holds
  int64_t vocab_begin_ = 0;       // the first one's vocabulary id
  DeviceBuffer local_logits_;     // [R, vocab_rows_] fp32 (communicator only)
  DeviceBuffer gathered_logits_;  // [ranks, R, vocab_rows_] fp32 (communicator only)
  std::unique_ptr<kernels::cuda::CublasLtGemm> gemm_;
  std::unique_ptr<CudaFp8Linear> fp8_;  // FP8 checkpoints only
  cublasHandle_t cublas_ = nullptr;     // the per-head absorption GEMMs
  DeviceBuffer cublas_workspace_;
  DeviceBuffer embed_tokens_, norm_, lm_head_;
  std::vector<Layer> layers_;
  DeviceBuffer inv_freq_;  // [qk_rope_head_dim / 2] fp32
  // Activations, [max_tokens, *] of the activation dtype; logits_ [max_logit_rows, vocab] fp32.
  DeviceBuffer hidden_, residual_, q_lora_, q_, ckv_, ckv_normed_, kpe_, attn_, gate_up_, act_,
      last_, logits_;
  DeviceBuffer mla_workspace_;  // kernels/mla: q_cat, o_lat, split partials
  // The unabsorbed prefill (kernels/mla MlaUnabsorbedAttention): its workspace, allocated once
  // for up to unabsorbed_rows_ context rows (num_seqs x max_seq_len; 0: the form is off, for
  // widths it does not take, FP8 latents and DCP), and this step's plan when Forward chose it
  // (kernels/mla/mla_prefill_select.h: the measured cost model; never under graph capture).
  DeviceBuffer unabsorbed_workspace_;
  int64_t unabsorbed_rows_ = 0;
  std::optional<kernels::cuda::MlaUnabsorbedPlan> step_unabsorbed_;
  std::unique_ptr<CudaMoeMlp> moe_;  // models with MoE layers: routing + expert scratch
  std::unique_ptr<CudaDcpExchange> dcp_exchange_;  // DCP only: lse, exchange and merged buffers
  int num_sms_ = 132;
  int64_t weight_bytes_ = 0;
  const void* input_embeds_ = nullptr;  // set_input_embeds
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MLA_MODEL_H_
