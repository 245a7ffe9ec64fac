// The DeepSeek-V2/V3 decoder with multi-head latent attention on the CPU backend
// (runtime/model/model_config.h's MLA fields; layers from first_k_dense_replace on are DeepSeek's
// MoE layer, moe_mlp.h).
//
// Per layer: RMSNorm (fused with the residual add) -> q: q_proj, or q_a_proj -> RMSNorm
// (q_a_layernorm, eps 1e-6 as transformers builds it) -> q_b_proj; latent: kv_a_proj_with_mqa ->
// [c_kv | k_pe], c_kv RMSNorm'ed (kv_a_layernorm, eps 1e-6) -> RoPE on q_pe and k_pe only
// (interleaved pairs or rotate-half, YaRN's cos/sin factor) -> the latent row into the paged
// latent cache (one per token and layer) -> MLA attention over the latent (kernels/mla: absorbed
// for decode, unabsorbed for prefill; softmax scale (Dn + Dr)^-0.5 times YaRN's
// mscale(factor, mscale_all_dim)^2) -> o_proj -> RMSNorm -> MLP: gate_up -> SiLU*up -> down_proj,
// or the MoE layer (routing, experts, shared experts).
//
// Tensor parallelism (a `group` of N > 1 ranks; `config` the rank's LocalModelConfig): each rank
// runs Hq/N heads (its rows of q_b_proj / q_proj and kv_b_proj, its o_proj columns) over the
// WHOLE latent, which every rank computes and caches alike (q_a / kv_a are replicated), so its
// latent blocks are the same on every rank and any P / D split pairs without re-sharding; the
// o_proj and MLP partial sums and the vocab-parallel embedding are all-reduced, the logits
// gathered, as in LlamaModel. Decode context parallelism (`dcp.size` > 1, as LlamaModel's): the
// slice's KVP ranks hold token shards of the latent, each runs its slice's heads over its shard
// (kernels/mla with the DcpShard, LSE out), one all-to-all per layer exchanges (out, lse), each
// rank merges its Hq/N heads and runs their o_proj columns.
// Thread safety: Forward() is not reentrant (scratch buffers); weights immutable after Create().
#ifndef TANDEM_RUNTIME_CPU_MLA_MODEL_H_
#define TANDEM_RUNTIME_CPU_MLA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mla/mla_attention.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/moe_mlp.h"
#include "runtime/cpu/tp_collectives.h"

namespace tandem::runtime {

class MlaModel : public CpuModel {
 public:
  // INVALID_ARGUMENT when `config` is not MLA, `weights` do not match it, or the DCP shard does
  // not fit the group (LlamaModel's rule). `group` (nullable) must outlive the model.
  // fp8_latent_kv: Forward's cache.data is an FP8 latent pool (runtime/engine/kv_layout.h,
  // Fp8LatentBlocks: each block its codes then its row scales; kernels/mla/mla_fp8_latent.h).
  static absl::StatusOr<std::unique_ptr<MlaModel>> Create(
      const ModelConfig& config, ModelWeights weights, kernels::ThreadPool* pool,
      comm::ProcessGroup* group = nullptr, kernels::DcpShard dcp = {}, bool fp8_latent_kv = false);

  absl::Status Forward(const ForwardInput& input, kernels::KvCacheView cache,
                       absl::Span<const int64_t> logit_rows, std::vector<float>* logits) override;
  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const override;
  std::vector<uint64_t> ExpertTokens() const override { return moe_.expert_tokens(); }
  const ModelConfig& config() const override { return config_; }
  const kernels::DcpShard& dcp() const override { return dcp_; }
  // The softmax scale and the RoPE cos/sin factor derived from the config.
  float softmax_scale() const { return softmax_scale_; }
  float rope_attention_factor() const { return rope_factor_; }
  const ModelWeights& weights() const { return weights_; }

 private:
  MlaModel(const ModelConfig& config, ModelWeights weights, std::vector<float> inv_freq,
           kernels::ThreadPool* pool, comm::ProcessGroup* group, kernels::DcpShard dcp,
           bool fp8_latent_kv);
  // The step's latent rows into `cache` and the attention over it (the FP8 pool or the fp32 one).
  absl::Status LatentAttention(int64_t l, const ForwardInput& input, kernels::KvCacheView cache);
  // Layer l's attention on hidden_ ([T, H], normalized) into hidden_ (o_proj output).
  absl::Status Attention(int64_t l, const ForwardInput& input, kernels::KvCacheView cache);
  // Layer l's MLP (dense, or DeepSeek's MoE layer) on hidden_ into hidden_.
  absl::Status Mlp(int64_t l, int64_t T);
  // out[T, n] = x[T, k] . W^T: the fp32 weight `w`, or `fp8` when it is loaded (FP8 checkpoints:
  // kernels::cpu::Fp8Linear, e4m3 codes dequantized block by block).
  absl::Status Project(const float* x, const std::vector<float>& w, const Fp8LinearWeight& fp8,
                       int64_t T, int64_t n, int64_t k, float* out);

  const ModelConfig config_;
  const ModelWeights weights_;
  const std::vector<float> inv_freq_;  // [qk_rope_head_dim / 2]
  const kernels::MlaDims dims_;
  const float softmax_scale_;
  const float rope_factor_;
  kernels::ThreadPool* const pool_;
  comm::ProcessGroup* const group_;  // null: one rank
  const int64_t vocab_begin_;        // this rank's embedding / lm_head rows
  const int64_t vocab_rows_;
  const kernels::DcpShard dcp_;
  const bool fp8_latent_kv_;
  // Scratch, grown on demand and reused across steps.
  std::vector<float> hidden_, residual_, q_lora_, q_, latent_, attn_, gate_up_, act_, moe_out_,
      lse_;
  TpScratch tp_;  // vocab-parallel logits, DCP exchange (tp_collectives.h)
  MoeMlp moe_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_MLA_MODEL_H_
