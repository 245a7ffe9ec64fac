#include "runtime/cpu/llama_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/reshape_and_cache.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/activation.h"
#include "kernels/layers/embedding.h"
#include "kernels/layers/norm.h"
#include "kernels/layers/rope.h"
#include "runtime/cpu/tp_collectives.h"
#include "runtime/engine/kv_layout.h"

namespace tandem::runtime {
namespace {

const float* OrNull(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// out[T, n] = x[T, k] w^T + bias: the FP8 weight when the layer has one (config.quantization;
// kernels/fp8 quantizes x as its scheme says), else the fp32 one.
absl::Status RunLinear(const float* x, const std::vector<float>& w, const Fp8LinearWeight& fp8,
                       const std::vector<float>& bias, int64_t T, int64_t n, int64_t k, float* out,
                       kernels::ThreadPool* pool) {
  if (fp8.empty()) {
    kernels::cpu::Linear(x, w.data(), OrNull(bias), T, n, k, out, pool);
    return absl::OkStatus();
  }
  if (fp8.grid.rows != n || fp8.grid.cols != k) {
    return absl::InternalError(absl::StrCat("FP8 weight [", fp8.grid.rows, ", ", fp8.grid.cols,
                                            "] used as [", n, ", ", k, "]"));
  }
  return kernels::cpu::Fp8Linear(x, fp8.View(), OrNull(bias), T, out, pool);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                               ModelWeights weights,
                                                               kernels::ThreadPool* pool,
                                                               comm::ProcessGroup* group,
                                                               kernels::DcpShard dcp, bool fp8_kv) {
  // Data-parallel attention: nothing is split by heads or vocabulary (no TP collective); the
  // group carries the MoE layers' all-to-alls only (moe_all_to_all.h).
  comm::ProcessGroup* dispatch =
      config.dp_attention && group != nullptr && group->size() > 1 ? group : nullptr;
  if (dispatch != nullptr) group = nullptr;
  RETURN_IF_ERROR(CheckDcpShard(dcp, group, config.num_attention_heads));
  if (static_cast<int64_t>(weights.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights have ", weights.layers.size(), " layers, config says ", config.num_hidden_layers));
  }
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    const bool moe = config.IsMoeLayer(l);
    const int64_t experts_gate_up =
        config.NumHeldExperts() * 2 * config.moe_intermediate_size * config.hidden_size;
    if ((config.qk_norm && (static_cast<int64_t>(w.q_norm.size()) != config.head_dim ||
                            static_cast<int64_t>(w.k_norm.size()) != config.head_dim)) ||
        (moe && (static_cast<int64_t>(w.router.size()) != config.num_experts * config.hidden_size ||
                 static_cast<int64_t>(w.experts_gate_up.size() +
                                      w.experts_gate_up_fp8.codes.size()) != experts_gate_up)) ||
        (!moe && w.gate_up_proj.empty() && w.gate_up_fp8.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, " weights do not match the config (q/k norms, router or experts)"));
    }
  }
  const int64_t embed_elems = VocabRows(config.vocab_size, group) * config.hidden_size;
  if (static_cast<int64_t>(weights.embed_tokens.size()) != embed_elems ||
      (!weights.lm_head.empty() && static_cast<int64_t>(weights.lm_head.size()) != embed_elems)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding / lm_head weights do not hold ", embed_elems / config.hidden_size,
        " vocabulary rows (the ", group == nullptr ? 1 : group->size(), "-way vocab partition)"));
  }
  const kernels::Fp8ScaleGrid& head = weights.lm_head_fp8.grid;
  if (config.quantization.lm_head != !weights.lm_head_fp8.empty() ||
      (config.quantization.lm_head &&
       (head.rows * head.cols != embed_elems || head.cols != config.hidden_size))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the FP8 lm_head ([", head.rows, ", ", head.cols, "]) does not match the config (lm_head ",
        config.quantization.lm_head ? "FP8" : "16-bit", ", ", embed_elems / config.hidden_size,
        " vocabulary rows of ", config.hidden_size, ")"));
  }
  ASSIGN_OR_RETURN(
      std::vector<float> inv_freq,
      kernels::ComputeRopeInvFreq(config.rope_theta, config.head_dim, config.rope_scaling));
  std::unique_ptr<LlamaModel> model(
      new LlamaModel(config, std::move(weights), std::move(inv_freq), pool, group, dcp, fp8_kv));
  if (dispatch != nullptr) model->moe_.UseAllToAll(dispatch);
  return model;
}

LlamaModel::LlamaModel(const ModelConfig& config, ModelWeights weights, std::vector<float> inv_freq,
                       kernels::ThreadPool* pool, comm::ProcessGroup* group, kernels::DcpShard dcp,
                       bool fp8_kv)
    : config_(config),
      weights_(std::move(weights)),
      inv_freq_(std::move(inv_freq)),
      pool_(pool),
      group_(group != nullptr && group->size() > 1 ? group : nullptr),
      vocab_begin_(group_ == nullptr ? 0 : group_->rank() * VocabRows(config.vocab_size, group_)),
      vocab_rows_(VocabRows(config.vocab_size, group_)),
      dcp_(dcp),
      fp8_kv_(fp8_kv) {}

absl::Status LlamaModel::Attend(const ForwardInput& input, kernels::KvCacheView cache, int64_t l,
                                const kernels::AttentionParams& params, int64_t Hq) {
  const int64_t T = static_cast<int64_t>(input.token_ids.size());
  float* lse = dcp_.size > 1 ? lse_.data() : nullptr;
  if (!fp8_kv_) {
    RETURN_IF_ERROR(kernels::cpu::ReshapeAndCache(k_.data(), v_.data(), input.slot_mapping.data(),
                                                  T, l, cache));
    return kernels::cpu::PagedAttention(q_.data(), Hq, cache, l, input.attention, params,
                                        attn_.data(), lse, pool_);
  }
  const LayerWeights& w = weights_.layers[l];
  const kernels::Fp8KvCacheView fp8{reinterpret_cast<uint8_t*>(cache.data), cache.layout,
                                    w.kv_k_scale > 0 ? w.kv_k_scale : kFp8KvTensorScale,
                                    w.kv_v_scale > 0 ? w.kv_v_scale : kFp8KvTensorScale};
  RETURN_IF_ERROR(
      kernels::cpu::ReshapeAndCacheFp8(k_.data(), v_.data(), input.slot_mapping.data(), T, l, fp8));
  return kernels::cpu::PagedAttention(q_.data(), Hq, fp8, l, input.attention, params, attn_.data(),
                                      lse, pool_);
}

kernels::KvCacheLayout LlamaModel::KvLayout(int64_t num_blocks, int64_t block_size) const {
  return KvLayoutForModel(config_, num_blocks, block_size);
}

absl::Status LlamaModel::Forward(const ForwardInput& input, kernels::KvCacheView cache,
                                 absl::Span<const int64_t> logit_rows, std::vector<float>* logits) {
  const int64_t T = static_cast<int64_t>(input.token_ids.size());
  const int64_t H = config_.hidden_size;
  const int64_t D = config_.head_dim;
  const int64_t Hq = config_.num_attention_heads;
  const int64_t Hk = config_.num_key_value_heads;
  const int64_t q_dim = Hq * D, kv_dim = Hk * D, qkv_dim = q_dim + 2 * kv_dim;
  const int64_t V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (T == 0 && moe_.uses_all_to_all()) {  // DP attention, no request here: the MoE collectives
    logits->clear();
    return moe_.RunIdle(config_, weights_, pool_);
  }
  RETURN_IF_ERROR(CheckForwardShape(T, static_cast<int64_t>(input.positions.size()),
                                    static_cast<int64_t>(input.slot_mapping.size()), logit_rows));

  hidden_.resize(T * H);
  residual_.resize(T * H);
  qkv_.resize(T * qkv_dim);
  q_.resize(T * q_dim);
  k_.resize(T * kv_dim);
  v_.resize(T * kv_dim);
  attn_.resize(T * q_dim);

  // residual_ holds the stream; hidden_ the normalized input of the next sub-block.
  RETURN_IF_ERROR(TpEmbedding(input.token_ids.data(), T, weights_.embed_tokens.data(), V, H,
                              vocab_begin_, vocab_rows_, group_, residual_.data()));
  kernels::AttentionParams attn_params;
  attn_params.scale = 1.0f / std::sqrt(static_cast<float>(D));
  attn_params.dcp_size = dcp_.size;
  attn_params.dcp_rank = dcp_.rank;
  attn_params.dcp_interleave = dcp_.interleave;
  // o_proj's input: this rank's heads after the DCP exchange, else all of attn_.
  const int64_t o_dim = q_dim / dcp_.size;
  if (dcp_.size > 1) {
    if (input.attention.local_seq_lens == nullptr) {
      return absl::InvalidArgumentError("Forward: DCP needs attention.local_seq_lens");
    }
    lse_.resize(T * Hq);
  }

  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    // Pre-attention norm. Layer 0 has nothing to add yet; later layers fold the MLP output
    // (left in hidden_) into the residual stream first.
    if (l == 0) {
      kernels::cpu::RmsNorm(residual_.data(), w.input_layernorm.data(), T, H, eps, hidden_.data());
    } else {
      kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(), w.input_layernorm.data(), T,
                                    H, eps);
    }
    RETURN_IF_ERROR(RunLinear(hidden_.data(), w.qkv_proj, w.qkv_fp8, w.qkv_bias, T, qkv_dim, H,
                              qkv_.data(), pool_));
    // Split the fused rows into contiguous q/k/v: [T, heads, D] each.
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv_.data() + t * qkv_dim;
      std::copy(row, row + q_dim, q_.data() + t * q_dim);
      std::copy(row + q_dim, row + q_dim + kv_dim, k_.data() + t * kv_dim);
      std::copy(row + q_dim + kv_dim, row + qkv_dim, v_.data() + t * kv_dim);
    }
    if (config_.qk_norm) {  // Qwen3: RMSNorm over each head's D values, before RoPE
      kernels::cpu::RmsNorm(q_.data(), w.q_norm.data(), T * Hq, D, eps, q_.data());
      kernels::cpu::RmsNorm(k_.data(), w.k_norm.data(), T * Hk, D, eps, k_.data());
    }
    kernels::cpu::ApplyRope(input.positions.data(), T, inv_freq_.data(), D, q_.data(), Hq,
                            k_.data(), Hk);
    RETURN_IF_ERROR(Attend(input, cache, l, attn_params, Hq));
    if (dcp_.size > 1) {
      RETURN_IF_ERROR(DcpExchangeAttention(attn_.data(), lse_.data(), T, Hq, config_.head_dim, dcp_,
                                           group_, &tp_));
    }
    RETURN_IF_ERROR(RunLinear(dcp_.size > 1 ? tp_.merged.data() : attn_.data(), w.o_proj, w.o_fp8,
                              w.o_bias, T, H, o_dim, hidden_.data(), pool_));
    if (group_ != nullptr) RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(hidden_)));
    kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(),
                                  w.post_attention_layernorm.data(), T, H, eps);
    RETURN_IF_ERROR(Mlp(l, T));
    if (group_ != nullptr) RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(hidden_)));
  }
  kernels::cpu::FusedAddRmsNorm(hidden_.data(), residual_.data(), weights_.norm.data(), T, H, eps);

  const std::vector<float>& lm_head =
      weights_.lm_head.empty() ? weights_.embed_tokens : weights_.lm_head;
  const kernels::Fp8WeightView head_fp8 = weights_.lm_head_fp8.View();
  return VocabParallelLogits(hidden_.data(), H, logit_rows,
                             weights_.lm_head_fp8.empty() ? lm_head.data() : nullptr,
                             config_.vocab_size, vocab_rows_, group_, pool_, &tp_, logits,
                             weights_.lm_head_fp8.empty() ? nullptr : &head_fp8);
}

absl::Status LlamaModel::Mlp(int64_t l, int64_t T) {
  const LayerWeights& w = weights_.layers[l];
  if (config_.IsMoeLayer(l)) return SparseMlp(w, T);
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  gate_up_.resize(T * 2 * I);
  act_.resize(T * I);
  RETURN_IF_ERROR(RunLinear(hidden_.data(), w.gate_up_proj, w.gate_up_fp8, w.gate_up_bias, T, 2 * I,
                            H, gate_up_.data(), pool_));
  kernels::cpu::SiluAndMul(gate_up_.data(), T, I, act_.data());
  return RunLinear(act_.data(), w.down_proj, w.down_fp8, w.down_bias, T, H, I, hidden_.data(),
                   pool_);
}

absl::Status LlamaModel::SparseMlp(const LayerWeights& w, int64_t T) {
  moe_out_.resize(T * config_.hidden_size);
  RETURN_IF_ERROR(moe_.Run(config_, w, hidden_.data(), T, moe_out_.data(), pool_));
  hidden_.swap(moe_out_);
  return absl::OkStatus();
}

}  // namespace tandem::runtime
