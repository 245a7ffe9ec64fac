#include "runtime/cuda/cuda_mla_model.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/convert_cuda.h"
#include "kernels/cuda/layers_cuda.h"
#include "kernels/layers/rope.h"
#include "kernels/mla/mla_cuda.h"
#include "runtime/engine/kv_layout.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps (as the CPU
// MlaModel).
constexpr float kLatentNormEps = 1e-6f;
// Split-KV partials beyond the unsplit workspace (PlanMla caps the splits to fit).
constexpr int64_t kSplitWorkspaceBytes = int64_t{256} << 20;
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;

kernels::MlaDims DimsOf(const ModelConfig& c) {
  return {c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank,
          c.v_head_dim};
}

// DeepSeek's yarn_apply_mscale: (Dn + Dr)^-0.5, times mscale(factor, mscale_all_dim)^2 for a
// non-default RoPE with mscale_all_dim set (runtime/engine/mla_model.cc).
float SoftmaxScale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  const kernels::RopeScaling& r = c.rope_scaling;
  if (r.type != kernels::RopeType::kDefault && r.mscale_all_dim != 0.0) {
    const double m = kernels::YarnGetMscale(r.factor, r.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

template <typename T>
T* Ptr(const DeviceBuffer& b) {
  return b.get<T>();
}

// out = a * w^T through cuBLASLt (a named helper keeps template commas out of macros).
template <typename T, typename TOut>
absl::Status Lin(kc::CublasLtGemm& gemm, const T* a, const T* w, int64_t m, int64_t n, int64_t k,
                 TOut* out, cudaStream_t stream) {
  return gemm.Linear<T, TOut>(a, w, nullptr, m, n, k, out, stream);
}

// One fp32 host tensor of `want` elements into a new device buffer of the activation dtype
// (converted on the device through `staging`); the host copy is freed.
absl::StatusOr<DeviceBuffer> UploadTensor(std::vector<float>* host, int64_t want, ActDtype dtype,
                                          DeviceBuffer* staging, const std::string& what,
                                          cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(host->size());
  if (n != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", what, " has ", n, " elements, expected ", want));
  }
  if (n == 0) return DeviceBuffer();
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(n * 2, what.c_str()));
  if (staging->bytes() < n * 4) {
    staging->Reset();
    ASSIGN_OR_RETURN(*staging, DeviceBuffer::Allocate(n * 4, "staging"));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging->data(), host->data(), n * 4, cudaMemcpyHostToDevice, stream));
  if (dtype == ActDtype::kBf16) {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging->get<float>(), n, out.get<__nv_bfloat16>(), stream));
  } else {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging->get<float>(), n, out.get<__half>(), stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // staging is reused next
  std::vector<float>().swap(*host);
  return out;
}

}  // namespace

CudaMlaModel::CudaMlaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config),
      options_(options),
      dims_(DimsOf(config)),
      softmax_scale_(SoftmaxScale(config)),
      rope_factor_(static_cast<float>(kernels::RopeAttentionFactor(config.rope_scaling))) {}

CudaMlaModel::~CudaMlaModel() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

absl::StatusOr<std::unique_ptr<CudaMlaModel>> CudaMlaModel::Create(const ModelConfig& config,
                                                                   ModelWeights weights,
                                                                   const CudaModelOptions& options,
                                                                   cudaStream_t stream) {
  if (!config.IsMla()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.architecture, " has no multi-head latent attention"));
  }
  RETURN_IF_ERROR(DimsOf(config).Validate());
  std::string missing;
  if (options.comm != nullptr) {
    missing = "tensor parallelism";
  } else if (options.dcp.size > 1) {
    missing = "decode context parallelism";
  } else if (options.dummy_seed.has_value()) {
    missing = "device dummy weights";
  }
  if (!missing.empty()) {
    return absl::UnimplementedError(absl::StrCat("--backend=cuda runs ", config.architecture,
                                                 " (MLA) without ", missing,
                                                 " for now; use --backend=cpu"));
  }
  bool dense_mlp = false;  // a layer with the dense MLP (MoE models: the first few, or none)
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) dense_mlp |= !config.IsMoeLayer(l);
  if (config.hidden_size % 8 != 0 || (dense_mlp && config.intermediate_size % 8 != 0) ||
      options.max_tokens <= 0 || options.max_logit_rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend needs hidden_size and intermediate_size multiples of 8 (got ",
        config.hidden_size, ", ", config.intermediate_size, ") and positive bounds"));
  }
  std::unique_ptr<CudaMlaModel> model(new CudaMlaModel(config, options));
  ASSIGN_OR_RETURN(model->gemm_, kc::CublasLtGemm::Create());
  if (cublasCreate(&model->cublas_) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("cublasCreate failed");
  }
  ASSIGN_OR_RETURN(model->cublas_workspace_,
                   DeviceBuffer::Allocate(kCublasWorkspaceBytes, "cuBLAS workspace"));
  CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(model->cublas_, model->cublas_workspace_.data(),
                                            model->cublas_workspace_.bytes()));
  ASSIGN_OR_RETURN(
      std::vector<float> inv_freq,
      kernels::ComputeRopeInvFreq(config.rope_theta, config.qk_rope_head_dim, config.rope_scaling));
  ASSIGN_OR_RETURN(model->inv_freq_, DeviceBuffer::Allocate(inv_freq.size() * 4, "inv_freq"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(model->inv_freq_.data(), inv_freq.data(), inv_freq.size() * 4,
                                  cudaMemcpyHostToDevice));
  int device = 0, sms = 132;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  RETURN_IF_ERROR(model->Upload(std::move(weights), stream));
  RETURN_IF_ERROR(model->Allocate(sms));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return model;
}

absl::Status CudaMlaModel::Upload(ModelWeights w, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t Hq = dims_.num_heads, Rq = c.q_lora_rank, q_in = Rq > 0 ? Rq : H;
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", w.layers.size(),
                                                   " layers, config says ", c.num_hidden_layers));
  }
  DeviceBuffer staging;
  const ActDtype dt = options_.dtype;
  ASSIGN_OR_RETURN(embed_tokens_,
                   UploadTensor(&w.embed_tokens, V * H, dt, &staging, "embed", stream));
  ASSIGN_OR_RETURN(norm_, UploadTensor(&w.norm, H, dt, &staging, "norm", stream));
  ASSIGN_OR_RETURN(lm_head_, UploadTensor(&w.lm_head, c.tie_word_embeddings ? 0 : V * H, dt,
                                          &staging, "lm_head", stream));
  layers_.resize(w.layers.size());
  weight_bytes_ = embed_tokens_.bytes() + norm_.bytes() + lm_head_.bytes();
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& s = w.layers[l];
    Layer& d = layers_[l];
    const bool moe = c.IsMoeLayer(static_cast<int64_t>(l));  // no dense MLP tensors
    const std::string p = absl::StrCat("layer ", l, " ");
    struct Item {
      DeviceBuffer* dst;
      std::vector<float>* src;
      int64_t n;
      const char* name;
    } items[] = {
        {&d.input_layernorm, &s.input_layernorm, H, "input_layernorm"},
        {&d.q_a_proj, &s.q_a_proj, Rq * H, "q_a_proj"},
        {&d.q_a_layernorm, &s.q_a_layernorm, Rq, "q_a_layernorm"},
        {&d.q_proj, &s.q_proj, Hq * dims_.QkHeadDim() * q_in, "q_proj"},
        {&d.kv_a_proj, &s.kv_a_proj, dims_.LatentDim() * H, "kv_a_proj_with_mqa"},
        {&d.kv_a_layernorm, &s.kv_a_layernorm, dims_.kv_lora_rank, "kv_a_layernorm"},
        {&d.kv_b_proj, &s.kv_b_proj,
         Hq * (dims_.qk_nope_head_dim + dims_.v_head_dim) * dims_.kv_lora_rank, "kv_b_proj"},
        {&d.o_proj, &s.o_proj, H * Hq * dims_.v_head_dim, "o_proj"},
        {&d.post_attention_layernorm, &s.post_attention_layernorm, H, "post_attention_layernorm"},
        {&d.gate_up_proj, &s.gate_up_proj, moe ? 0 : 2 * I * H, "gate_up_proj"},
        {&d.down_proj, &s.down_proj, moe ? 0 : H * I, "down_proj"},
    };
    for (const Item& it : items) {
      ASSIGN_OR_RETURN(*it.dst, UploadTensor(it.src, it.n, dt, &staging, p + it.name, stream));
      weight_bytes_ += it.dst->bytes();
    }
    if (moe && dt == ActDtype::kBf16) {
      ASSIGN_OR_RETURN(d.moe, UploadMoeWeights<__nv_bfloat16>(c, &s, stream));
    } else if (moe) {
      ASSIGN_OR_RETURN(d.moe, UploadMoeWeights<__half>(c, &s, stream));
    }
    weight_bytes_ += d.moe.bytes();
  }
  return absl::OkStatus();
}

absl::Status CudaMlaModel::Allocate(int64_t num_sms) {
  num_sms_ = static_cast<int>(num_sms);
  const int64_t T = options_.max_tokens, R = options_.max_logit_rows;
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t Hq = dims_.num_heads;
  struct Item {
    DeviceBuffer* b;
    int64_t elems;
    const char* what;
  } items[] = {
      {&hidden_, T * H, "hidden"},
      {&residual_, T * H, "residual"},
      {&q_lora_, T * std::max<int64_t>(config_.q_lora_rank, 1), "q_lora"},
      {&q_, T * Hq * dims_.QkHeadDim(), "q"},
      {&ckv_, T * dims_.kv_lora_rank, "c_kv"},
      {&ckv_normed_, T * dims_.kv_lora_rank, "c_kv normed"},
      {&kpe_, T * dims_.qk_rope_head_dim, "k_pe"},
      {&attn_, T * Hq * dims_.v_head_dim, "attn"},
      {&gate_up_, T * 2 * I, "gate_up"},
      {&act_, T * I, "act"},
      {&last_, R * H, "last"},
  };
  for (const Item& it : items) {
    ASSIGN_OR_RETURN(*it.b, DeviceBuffer::Allocate(it.elems * 2, it.what));
  }
  ASSIGN_OR_RETURN(logits_, DeviceBuffer::Allocate(R * config_.vocab_size * 4, "logits"));
  if (config_.IsMoe()) {
    ASSIGN_OR_RETURN(moe_, CudaMoeMlp::Create(config_, T));
  }
  kc::MlaPlanInput in{.dims = dims_,
                      .num_seqs = T,
                      .num_tokens = T,
                      .max_q_len = T,
                      .max_seq_len = 1,
                      .num_sms = num_sms_,
                      .num_splits = 1};
  ASSIGN_OR_RETURN(const kc::MlaPlan unsplit, kc::PlanMla(in));
  ASSIGN_OR_RETURN(
      mla_workspace_,
      DeviceBuffer::Allocate(unsplit.workspace_bytes + kSplitWorkspaceBytes, "MLA workspace"));
  return absl::OkStatus();
}

kernels::KvCacheLayout CudaMlaModel::KvLayout(int64_t num_blocks, int64_t block_size) const {
  return KvLayoutForModel(config_, num_blocks, block_size);
}

kc::KvDtype CudaMlaModel::kv_dtype() const {
  return options_.dtype == ActDtype::kBf16 ? kc::KvDtype::kBf16 : kc::KvDtype::kFp16;
}

absl::Status CudaMlaModel::Forward(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                   const StepAttentionPlan& plan, void* /*attn_workspace*/,
                                   cudaStream_t stream) {
  if (step.num_tokens <= 0 || step.num_tokens > options_.max_tokens || step.num_logit_rows < 0 ||
      step.num_logit_rows > options_.max_logit_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: ", step.num_tokens, " tokens / ", step.num_logit_rows,
                     " logit rows outside the model's bounds (", options_.max_tokens, " / ",
                     options_.max_logit_rows, ")"));
  }
  if (cache.dtype != kv_dtype()) {
    return absl::InvalidArgumentError("Forward: KV pool dtype differs from the model's");
  }
  const kc::PagedAttentionPlanInput& b = plan.decode.input;
  kc::MlaPlanInput in{.dims = dims_,
                      .num_seqs = step.attention.num_seqs,
                      .num_tokens = step.num_tokens,
                      .max_q_len = std::max<int64_t>(b.max_q_len, 1),
                      .max_seq_len = b.max_seq_len,
                      .num_sms = num_sms_,
                      .max_workspace_bytes = mla_workspace_.bytes()};
  ASSIGN_OR_RETURN(const kc::MlaPlan mla, kc::PlanMla(in));
  if (mla.workspace_bytes > mla_workspace_.bytes()) {
    return absl::InternalError("Forward: the MLA workspace is too small for the step");
  }
  if (options_.dtype == ActDtype::kBf16) return ForwardT<__nv_bfloat16>(step, cache, mla, stream);
  return ForwardT<__half>(step, cache, mla, stream);
}

template <typename T>
absl::Status CudaMlaModel::Attention(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                     int64_t l, const kc::MlaPlan& plan, cudaStream_t stream) {
  const Layer& w = layers_[l];
  const int64_t Tn = step.num_tokens, H = config_.hidden_size, Rq = config_.q_lora_rank;
  const int64_t Hq = dims_.num_heads, Dqk = dims_.QkHeadDim(), L = dims_.kv_lora_rank;
  const int64_t Dr = dims_.qk_rope_head_dim, Dn = dims_.qk_nope_head_dim;
  const T* hidden = Ptr<T>(hidden_);
  T* q = Ptr<T>(q_);
  if (Rq > 0) {
    RETURN_IF_ERROR(Lin(*gemm_, hidden, Ptr<T>(w.q_a_proj), Tn, Rq, H, Ptr<T>(q_lora_), stream));
    RETURN_IF_ERROR(kc::RmsNorm<T>(Ptr<T>(q_lora_), Ptr<T>(w.q_a_layernorm), Tn, Rq, kLatentNormEps,
                                   Ptr<T>(q_lora_), stream));
    RETURN_IF_ERROR(Lin(*gemm_, Ptr<T>(q_lora_), Ptr<T>(w.q_proj), Tn, Hq * Dqk, Rq, q, stream));
  } else {
    RETURN_IF_ERROR(Lin(*gemm_, hidden, Ptr<T>(w.q_proj), Tn, Hq * Dqk, H, q, stream));
  }
  // kv_a_proj_with_mqa as two products, so c_kv and k_pe are dense rows of their own.
  RETURN_IF_ERROR(Lin(*gemm_, hidden, Ptr<T>(w.kv_a_proj), Tn, L, H, Ptr<T>(ckv_), stream));
  RETURN_IF_ERROR(
      Lin(*gemm_, hidden, Ptr<T>(w.kv_a_proj) + L * H, Tn, Dr, H, Ptr<T>(kpe_), stream));
  RETURN_IF_ERROR(kc::RmsNorm<T>(Ptr<T>(ckv_), Ptr<T>(w.kv_a_layernorm), Tn, L, kLatentNormEps,
                                 Ptr<T>(ckv_normed_), stream));
  const float* inv_freq = inv_freq_.get<float>();
  RETURN_IF_ERROR(kc::MlaRope<T>(step.positions, Tn, inv_freq, Dr, rope_factor_,
                                 config_.rope_interleave, q, Hq, Dqk, Dn, stream));
  RETURN_IF_ERROR(kc::MlaRope<T>(step.positions, Tn, inv_freq, Dr, rope_factor_,
                                 config_.rope_interleave, Ptr<T>(kpe_), 1, Dr, 0, stream));
  RETURN_IF_ERROR(kc::MlaWriteLatent<T>(Ptr<T>(ckv_normed_), L, Ptr<T>(kpe_), Dr, step.slot_mapping,
                                        Tn, dims_, cache, l, stream));
  return kc::MlaAbsorbedAttention<T>(cublas_, q, Ptr<T>(w.kv_b_proj), cache, l, step.attention,
                                     softmax_scale_, plan, mla_workspace_.data(), Ptr<T>(attn_),
                                     nullptr, stream);
}

template <typename T>
absl::Status CudaMlaModel::ForwardT(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                    const kc::MlaPlan& plan, cudaStream_t stream) {
  const int64_t Tn = step.num_tokens, R = step.num_logit_rows;
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  T* hidden = Ptr<T>(hidden_);
  T* residual = Ptr<T>(residual_);
  RETURN_IF_ERROR(
      kc::Embedding<T>(step.token_ids, Tn, Ptr<T>(embed_tokens_), V, H, residual, stream));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& w = layers_[l];
    if (l == 0) {
      RETURN_IF_ERROR(
          kc::RmsNorm<T>(residual, Ptr<T>(w.input_layernorm), Tn, H, eps, hidden, stream));
    } else {
      RETURN_IF_ERROR(
          kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(w.input_layernorm), Tn, H, eps, stream));
    }
    RETURN_IF_ERROR(Attention<T>(step, cache, l, plan, stream));
    RETURN_IF_ERROR(Lin(*gemm_, Ptr<T>(attn_), Ptr<T>(w.o_proj), Tn, H,
                        dims_.num_heads * dims_.v_head_dim, hidden, stream));
    RETURN_IF_ERROR(kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(w.post_attention_layernorm), Tn,
                                           H, eps, stream));
    if (config_.IsMoeLayer(l)) {  // DeepSeek's MoE layer: routed + shared experts
      RETURN_IF_ERROR(moe_->Forward<T>(w.moe, hidden, Tn, l, hidden, *gemm_, stream));
      continue;
    }
    RETURN_IF_ERROR(
        Lin(*gemm_, hidden, Ptr<T>(w.gate_up_proj), Tn, 2 * I, H, Ptr<T>(gate_up_), stream));
    RETURN_IF_ERROR(kc::SiluAndMul<T>(Ptr<T>(gate_up_), Tn, I, Ptr<T>(act_), stream));
    RETURN_IF_ERROR(Lin(*gemm_, Ptr<T>(act_), Ptr<T>(w.down_proj), Tn, H, I, hidden, stream));
  }
  RETURN_IF_ERROR(kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(norm_), Tn, H, eps, stream));
  if (R == 0) return absl::OkStatus();
  RETURN_IF_ERROR(kc::GatherRows<T>(hidden, H, step.logit_rows, R, Ptr<T>(last_), stream));
  const DeviceBuffer& lm_head = lm_head_.bytes() == 0 ? embed_tokens_ : lm_head_;
  return Lin(*gemm_, Ptr<T>(last_), Ptr<T>(lm_head), R, V, H, logits_.get<float>(), stream);
}

}  // namespace tandem::runtime::cuda
