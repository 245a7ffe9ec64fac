#include "runtime/cpu/mla_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/activation.h"
#include "kernels/layers/embedding.h"
#include "kernels/layers/norm.h"
#include "kernels/layers/rope.h"
#include "kernels/mla/mla_fp8_latent.h"
#include "runtime/cpu/tp_collectives.h"
#include "runtime/engine/kv_layout.h"

namespace tandem::runtime {
namespace {

// transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps, not the
// config's rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

kernels::MlaDims DimsOf(const ModelConfig& c) {
  return {c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank,
          c.v_head_dim};
}

// DeepSeek's yarn_apply_mscale: (Dn + Dr)^-0.5, times mscale(factor, mscale_all_dim)^2 for a
// non-default RoPE with mscale_all_dim set.
float SoftmaxScale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  const kernels::RopeScaling& r = c.rope_scaling;
  if (r.type != kernels::RopeType::kDefault && r.mscale_all_dim != 0.0) {
    const double m = kernels::YarnGetMscale(r.factor, r.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

// o_proj holds the columns of Hq / dcp_size heads (the heads a rank owns after the DCP exchange).
absl::Status CheckWeights(const ModelConfig& c, const ModelWeights& w, int64_t vocab_rows,
                          int64_t dcp_size) {
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", w.layers.size(),
                                                   " layers, config says ", c.num_hidden_layers));
  }
  const kernels::MlaDims d = DimsOf(c);
  const int64_t H = c.hidden_size, q_in = c.q_lora_rank > 0 ? c.q_lora_rank : H;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& x = w.layers[l];
    auto size = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size()); };
    // A projection's elements: its fp32 vector's, or its FP8 codes' (FP8 checkpoints).
    auto elems = [](const std::vector<float>& v, const Fp8LinearWeight& f) {
      return static_cast<int64_t>(v.size() + f.codes.size());
    };
    const bool ok =
        elems(x.q_a_proj, x.q_a_fp8) == c.q_lora_rank * H &&
        size(x.q_a_layernorm) == c.q_lora_rank &&
        elems(x.q_proj, x.q_fp8) == d.num_heads * d.QkHeadDim() * q_in &&
        elems(x.kv_a_proj, x.kv_a_fp8) == d.LatentDim() * H &&
        size(x.kv_a_layernorm) == d.kv_lora_rank &&
        size(x.kv_b_proj) == d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank &&
        elems(x.o_proj, x.o_fp8) == H * d.num_heads / dcp_size * d.v_head_dim &&
        (c.IsMoeLayer(l) ? size(x.router) == c.num_experts * H
                         : elems(x.gate_up_proj, x.gate_up_fp8) == 2 * c.intermediate_size * H &&
                               elems(x.down_proj, x.down_fp8) == H * c.intermediate_size);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " weights do not match the MLA config"));
    }
  }
  if (static_cast<int64_t>(w.embed_tokens.size()) != vocab_rows * H ||
      (!w.lm_head.empty() && static_cast<int64_t>(w.lm_head.size()) != vocab_rows * H)) {
    return absl::InvalidArgumentError("embedding / lm_head weights do not match the vocabulary");
  }
  if (c.quantization.lm_head || !w.lm_head_fp8.empty()) {
    return absl::InvalidArgumentError(
        "an FP8 lm_head (--quantize_lm_head) is supported for Llama-family models, not MLA");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MlaModel>> MlaModel::Create(
    const ModelConfig& config, ModelWeights weights, kernels::ThreadPool* pool,
    comm::ProcessGroup* group, kernels::DcpShard dcp, bool fp8_latent_kv) {
  if (!config.IsMla()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.architecture, " has no multi-head latent attention"));
  }
  if (group != nullptr && group->size() <= 1) group = nullptr;
  // Data-parallel attention: the group carries the MoE layers' all-to-alls only (llama_model.cc).
  comm::ProcessGroup* dispatch = config.dp_attention ? group : nullptr;
  if (dispatch != nullptr) group = nullptr;
  RETURN_IF_ERROR(CheckDcpShard(dcp, group, config.num_attention_heads));
  RETURN_IF_ERROR(DimsOf(config).Validate());
  RETURN_IF_ERROR(CheckWeights(config, weights, VocabRows(config.vocab_size, group), dcp.size));
  ASSIGN_OR_RETURN(
      std::vector<float> inv_freq,
      kernels::ComputeRopeInvFreq(config.rope_theta, config.qk_rope_head_dim, config.rope_scaling));
  std::unique_ptr<MlaModel> model(new MlaModel(config, std::move(weights), std::move(inv_freq),
                                               pool, group, dcp, fp8_latent_kv));
  if (dispatch != nullptr) model->moe_.UseAllToAll(dispatch);
  return model;
}

MlaModel::MlaModel(const ModelConfig& config, ModelWeights weights, std::vector<float> inv_freq,
                   kernels::ThreadPool* pool, comm::ProcessGroup* group, kernels::DcpShard dcp,
                   bool fp8_latent_kv)
    : config_(config),
      weights_(std::move(weights)),
      inv_freq_(std::move(inv_freq)),
      dims_(DimsOf(config)),
      softmax_scale_(SoftmaxScale(config)),
      rope_factor_(static_cast<float>(kernels::RopeAttentionFactor(config.rope_scaling))),
      pool_(pool),
      group_(group),
      vocab_begin_(group == nullptr ? 0 : group->rank() * VocabRows(config.vocab_size, group)),
      vocab_rows_(VocabRows(config.vocab_size, group)),
      dcp_(dcp),
      fp8_latent_kv_(fp8_latent_kv) {}

kernels::KvCacheLayout MlaModel::KvLayout(int64_t num_blocks, int64_t block_size) const {
  return KvLayoutForModel(config_, num_blocks, block_size);
}

absl::Status MlaModel::Forward(const ForwardInput& input, kernels::KvCacheView cache,
                               absl::Span<const int64_t> logit_rows, std::vector<float>* logits) {
  const int64_t T = static_cast<int64_t>(input.token_ids.size());
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (T == 0 && moe_.uses_all_to_all()) {  // DP attention, no request here: the MoE collectives
    logits->clear();
    return moe_.RunIdle(config_, weights_, pool_);
  }
  RETURN_IF_ERROR(CheckForwardShape(T, static_cast<int64_t>(input.positions.size()),
                                    static_cast<int64_t>(input.slot_mapping.size()), logit_rows));
  hidden_.resize(T * H);
  residual_.resize(T * H);
  if (!input.input_embeds.empty()) {  // the MTP block's projected input (mtp_model.h)
    if (static_cast<int64_t>(input.input_embeds.size()) != T * H) {
      return absl::InvalidArgumentError("Forward: input_embeds is not [T, hidden]");
    }
    std::copy(input.input_embeds.begin(), input.input_embeds.end(), residual_.begin());
  } else {
    RETURN_IF_ERROR(TpEmbedding(input.token_ids.data(), T, weights_.embed_tokens.data(), V, H,
                                vocab_begin_, vocab_rows_, group_, residual_.data()));
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    if (l == 0) {
      kernels::cpu::RmsNorm(residual_.data(), w.input_layernorm.data(), T, H, eps, hidden_.data());
    } else {
      kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(), w.input_layernorm.data(), T,
                                    H, eps);
    }
    RETURN_IF_ERROR(Attention(l, input, cache));
    if (group_ != nullptr) RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(hidden_)));
    kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(),
                                  w.post_attention_layernorm.data(), T, H, eps);
    RETURN_IF_ERROR(Mlp(l, T));
    if (group_ != nullptr) RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(hidden_)));
  }
  kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(), weights_.norm.data(), T, H, eps);
  if (input.hidden_out != nullptr) {  // residual_ is now the norm's input, hidden_ its output
    const std::vector<float>& h = input.hidden_out_before_norm ? residual_ : hidden_;
    input.hidden_out->assign(h.begin(), h.begin() + T * H);
  }
  const std::vector<float>& lm_head =
      weights_.lm_head.empty() ? weights_.embed_tokens : weights_.lm_head;
  return VocabParallelLogits(hidden_.data(), H, logit_rows, lm_head.data(), config_.vocab_size,
                             vocab_rows_, group_, pool_, &tp_, logits);
}

absl::Status MlaModel::Attention(int64_t l, const ForwardInput& input, kernels::KvCacheView cache) {
  const LayerWeights& w = weights_.layers[l];
  const int64_t T = static_cast<int64_t>(input.token_ids.size());
  const int64_t H = config_.hidden_size, Hq = dims_.num_heads, Dqk = dims_.QkHeadDim();
  const int64_t L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim, W = dims_.LatentDim();
  const int64_t Rq = config_.q_lora_rank;
  q_.resize(T * Hq * Dqk);
  latent_.resize(T * W);
  attn_.resize(T * Hq * dims_.v_head_dim);
  // q: [T, Hq, Dn + Dr].
  if (Rq > 0) {
    q_lora_.resize(T * Rq);
    RETURN_IF_ERROR(Project(hidden_.data(), w.q_a_proj, w.q_a_fp8, T, Rq, H, q_lora_.data()));
    kernels::cpu::RmsNorm(q_lora_.data(), w.q_a_layernorm.data(), T, Rq, kLatentNormEps,
                          q_lora_.data());
    RETURN_IF_ERROR(Project(q_lora_.data(), w.q_proj, w.q_fp8, T, Hq * Dqk, Rq, q_.data()));
  } else {
    RETURN_IF_ERROR(Project(hidden_.data(), w.q_proj, w.q_fp8, T, Hq * Dqk, H, q_.data()));
  }
  // latent: [T, L + Dr] = [c_kv | k_pe]; c_kv normalized in place, row by row.
  RETURN_IF_ERROR(Project(hidden_.data(), w.kv_a_proj, w.kv_a_fp8, T, W, H, latent_.data()));
  for (int64_t t = 0; t < T; ++t) {
    float* c_kv = latent_.data() + t * W;
    kernels::cpu::RmsNorm(c_kv, w.kv_a_layernorm.data(), 1, L, kLatentNormEps, c_kv);
  }
  kernels::cpu::ApplyMlaRope(input.positions.data(), T, inv_freq_.data(), Dr, rope_factor_,
                             config_.rope_interleave, {q_.data(), Hq, Dqk, dims_.qk_nope_head_dim});
  kernels::cpu::ApplyMlaRope(input.positions.data(), T, inv_freq_.data(), Dr, rope_factor_,
                             config_.rope_interleave, {latent_.data(), 1, W, L});
  const bool dcp = dcp_.size > 1;
  if (dcp) {
    if (input.attention.local_seq_lens == nullptr) {
      return absl::InvalidArgumentError("Forward: DCP needs attention.local_seq_lens");
    }
    lse_.resize(T * Hq);
  }
  RETURN_IF_ERROR(LatentAttention(l, input, cache));
  if (dcp) {
    RETURN_IF_ERROR(DcpExchangeAttention(attn_.data(), lse_.data(), T, Hq, dims_.v_head_dim, dcp_,
                                         group_, &tp_));
  }
  return Project(dcp ? tp_.merged.data() : attn_.data(), w.o_proj, w.o_fp8, T, H,
                 Hq / dcp_.size * dims_.v_head_dim, hidden_.data());
}

absl::Status MlaModel::LatentAttention(int64_t l, const ForwardInput& input,
                                       kernels::KvCacheView cache) {
  const int64_t T = static_cast<int64_t>(input.token_ids.size());
  float* lse = dcp_.size > 1 ? lse_.data() : nullptr;
  const float* kv_b = weights_.layers[l].kv_b_proj.data();
  if (!fp8_latent_kv_) {
    RETURN_IF_ERROR(
        kernels::cpu::WriteLatentCache(latent_.data(), input.slot_mapping.data(), T, l, cache));
    return kernels::cpu::MlaPagedAttention(q_.data(), kv_b, dims_, cache, l, input.attention,
                                           softmax_scale_, kernels::MlaMode::kAuto, attn_.data(),
                                           lse, pool_, dcp_);
  }
  // FP8 latent KV: each row quantized with its own scale; attention over the dequantized rows.
  // The blocks form (kv_layout.h): each block its codes then its scales, one range P -> D.
  const Fp8LatentPool p = Fp8LatentBlocks(cache.data, cache.layout);
  const kernels::cpu::Fp8LatentCacheView fp8{p.codes, p.scales, cache.layout, p.block_bytes};
  RETURN_IF_ERROR(
      kernels::cpu::WriteLatentCacheFp8(latent_.data(), input.slot_mapping.data(), T, l, fp8));
  return kernels::cpu::MlaPagedAttentionFp8(q_.data(), kv_b, dims_, fp8, l, input.attention,
                                            softmax_scale_, kernels::MlaMode::kAuto, attn_.data(),
                                            lse, pool_, dcp_);
}

absl::Status MlaModel::Mlp(int64_t l, int64_t T) {
  const LayerWeights& w = weights_.layers[l];
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  if (config_.IsMoeLayer(l)) {  // DeepSeek's MoE layer (moe_mlp.h)
    moe_out_.resize(T * H);
    RETURN_IF_ERROR(moe_.Run(config_, w, hidden_.data(), T, moe_out_.data(), pool_));
    hidden_.swap(moe_out_);
    return absl::OkStatus();
  }
  gate_up_.resize(T * 2 * I);
  act_.resize(T * I);
  RETURN_IF_ERROR(
      Project(hidden_.data(), w.gate_up_proj, w.gate_up_fp8, T, 2 * I, H, gate_up_.data()));
  kernels::cpu::SiluAndMul(gate_up_.data(), T, I, act_.data());
  return Project(act_.data(), w.down_proj, w.down_fp8, T, H, I, hidden_.data());
}

absl::Status MlaModel::Project(const float* x, const std::vector<float>& w,
                               const Fp8LinearWeight& fp8, int64_t T, int64_t n, int64_t k,
                               float* out) {
  if (fp8.empty()) {
    kernels::cpu::Linear(x, w.data(), nullptr, T, n, k, out, pool_);
    return absl::OkStatus();
  }
  if (fp8.grid.rows != n || fp8.grid.cols != k) {
    return absl::InternalError(absl::StrCat("FP8 weight [", fp8.grid.rows, ", ", fp8.grid.cols,
                                            "] used as [", n, ", ", k, "]"));
  }
  return kernels::cpu::Fp8Linear(x, fp8.View(), nullptr, T, out, pool_);
}

}  // namespace tandem::runtime
