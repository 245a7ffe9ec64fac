#include "runtime/cuda/cuda_llama_model.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/rope_cache_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/convert_cuda.h"
#include "kernels/layers/cuda/head_norm_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/rope.h"
#include "kernels/sampling/cuda/shard_argmax_cuda.h"
#include "runtime/cuda/dense_linear.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/half.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// bf16 and fp16 are both two bytes.
int64_t ActBytes(ActDtype /*dtype*/) { return 2; }

// Uploads one fp32 host tensor into a new device buffer of the activation dtype, converting on
// the device through `staging` (fp32, large enough), then frees the host copy.
absl::StatusOr<DeviceBuffer> UploadTensor(std::vector<float>* host, ActDtype dtype,
                                          DeviceBuffer* staging, const char* what,
                                          cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(host->size());
  if (n == 0) return DeviceBuffer();
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(n * ActBytes(dtype), what));
  if (staging->bytes() < n * static_cast<int64_t>(sizeof(float))) {
    staging->Reset();
    ASSIGN_OR_RETURN(*staging,
                     DeviceBuffer::Allocate(n * static_cast<int64_t>(sizeof(float)), "staging"));
  }
  // The copy is synchronous (pageable source); the conversion is ordered after it on `stream`.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging->data(), host->data(), n * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
  if (dtype == ActDtype::kBf16) {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging->get<float>(), n, out.get<__nv_bfloat16>(), stream));
  } else {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging->get<float>(), n, out.get<__half>(), stream));
  }
  // Keep the staging buffer valid until the conversion ran before reusing it.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<float>().swap(*host);
  return out;
}

absl::Status CheckSize(const std::vector<float>& v, int64_t want, const std::string& name) {
  if (static_cast<int64_t>(v.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", name, " has ", v.size(), " elements, expected ", want));
  }
  return absl::OkStatus();
}

template <typename T>
T* Ptr(const DeviceBuffer& b) {
  return b.get<T>();
}

}  // namespace

const char* ActDtypeName(ActDtype dtype) { return dtype == ActDtype::kBf16 ? "bf16" : "fp16"; }

CudaLlamaModel::CudaLlamaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config), options_(options) {}

CudaLlamaModel::~CudaLlamaModel() = default;

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::Create(
    const ModelConfig& config, ModelWeights weights, const CudaModelOptions& options,
    cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  const int64_t D = config.head_dim;
  bool dense_mlp = false;  // a layer with the dense MLP (MoE models: some, or none)
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) dense_mlp |= !config.IsMoeLayer(l);
  if (config.hidden_size % 8 != 0 || (dense_mlp && config.intermediate_size % 8 != 0) ||
      D % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend needs hidden_size and intermediate_size multiples of 8 and head_dim a "
        "multiple of 16 (got ",
        config.hidden_size, ", ", config.intermediate_size, ", ", D, ")"));
  }
  if (options.max_tokens <= 0 || options.max_logit_rows <= 0) {
    return absl::InvalidArgumentError("max_tokens and max_logit_rows must be positive");
  }
  const CudaModelOptions& opts = options;
  if (opts.comm != nullptr && opts.dummy_seed.has_value() && opts.dummy_plan.empty()) {
    return absl::InvalidArgumentError(
        "device dummy weights of a tensor-parallel rank need its plan (DummyWeightPlan)");
  }
  if (opts.dcp.size > 1 &&
      (opts.comm == nullptr || config.num_attention_heads % opts.dcp.size != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DCP size ", opts.dcp.size, " needs a tensor-parallel communicator and ",
                     "must divide the ", config.num_attention_heads, " local attention heads"));
  }
  if (config.quantization.IsFp8() && opts.dtype != ActDtype::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 weights (", config.quantization.Describe(),
        ") run with bf16 activations on the CUDA backend; --dtype=fp16 is not supported"));
  }
  std::unique_ptr<CudaLlamaModel> model(new CudaLlamaModel(config, opts));
  if (config.quantization.IsFp8()) {
    const int64_t max_k = std::max({config.hidden_size, config.intermediate_size,
                                    config.num_attention_heads * D / opts.dcp.size});
    ASSIGN_OR_RETURN(model->fp8_, CudaFp8Linear::Create(opts.max_tokens, max_k));
  }
  const int64_t n = opts.comm == nullptr ? 1 : opts.comm->size();
  model->vocab_rows_ = (config.vocab_size + n - 1) / n;
  model->vocab_begin_ = opts.comm == nullptr ? 0 : opts.comm->rank() * model->vocab_rows_;
  ASSIGN_OR_RETURN(model->gemm_, kc::CublasLtGemm::Create());
  ASSIGN_OR_RETURN(std::vector<float> inv_freq,
                   kernels::ComputeRopeInvFreq(config.rope_theta, D, config.rope_scaling));
  ASSIGN_OR_RETURN(model->inv_freq_,
                   DeviceBuffer::Allocate(inv_freq.size() * sizeof(float), "rope inv_freq"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(model->inv_freq_.data(), inv_freq.data(),
                                  inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (opts.fp8_kv) RETURN_IF_ERROR(model->SetKvScales(weights));
  if (options.dummy_seed.has_value() || options.checkpoint.has_value()) {
    if (!weights.layers.empty() || !weights.embed_tokens.empty()) {
      return absl::InvalidArgumentError(
          "weights generated or read on the device requested but host weights were given");
    }
    RETURN_IF_ERROR(options.checkpoint.has_value()
                        ? model->LoadCheckpoint(*options.checkpoint, stream)
                        : model->GenerateDummy(*options.dummy_seed, stream));
  } else {
    RETURN_IF_ERROR(model->Upload(std::move(weights), stream));
  }
  RETURN_IF_ERROR(model->AllocateActivations());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return model;
}

absl::Status CudaLlamaModel::Upload(ModelWeights w, cudaStream_t stream) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t D = config_.head_dim, Hq = config_.num_attention_heads,
                Hk = config_.num_key_value_heads;
  const int64_t qkv_dim = (Hq + 2 * Hk) * D;
  if (static_cast<int64_t>(w.layers.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights have ", w.layers.size(), " layers, config says ", config_.num_hidden_layers));
  }
  const int64_t P = vocab_rows_;  // the whole vocabulary without a group
  // Row-parallel biases are added by rank 0 only (runtime/model/tensor_parallel.h).
  const bool row_bias = comm() == nullptr || comm()->rank() == 0;
  RETURN_IF_ERROR(CheckSize(w.embed_tokens, P * H, "embed_tokens"));
  RETURN_IF_ERROR(CheckSize(w.norm, H, "norm"));
  const bool head_fp8 = config_.quantization.lm_head;
  if (!config_.tie_word_embeddings && !head_fp8) {
    RETURN_IF_ERROR(CheckSize(w.lm_head, P * H, "lm_head"));
  }
  if (head_fp8 != !w.lm_head_fp8.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the config's lm_head is ", head_fp8 ? "FP8" : "16-bit", " but the weights' is not"));
  }
  DeviceBuffer staging;
  const ActDtype dt = options_.dtype;
  ASSIGN_OR_RETURN(embed_tokens_, UploadTensor(&w.embed_tokens, dt, &staging, "embed", stream));
  ASSIGN_OR_RETURN(norm_, UploadTensor(&w.norm, dt, &staging, "norm", stream));
  ASSIGN_OR_RETURN(lm_head_, UploadTensor(&w.lm_head, dt, &staging, "lm_head", stream));
  if (head_fp8) {
    ASSIGN_OR_RETURN(lm_head_fp8_,
                     UploadFp8Weight(&w.lm_head_fp8, P, H, options_.max_tokens, "lm_head"));
  }
  layers_.resize(w.layers.size());
  const bool fp8 = config_.quantization.IsFp8();
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& src = w.layers[l];
    const std::string p = absl::StrCat("layer ", l, " ");
    RETURN_IF_ERROR(CheckSize(src.input_layernorm, H, p + "input_layernorm"));
    const int64_t dense = fp8 ? 0 : 1;  // FP8: the fp32 projections are empty
    RETURN_IF_ERROR(CheckSize(src.qkv_proj, dense * qkv_dim * H, p + "qkv_proj"));
    // DCP: o_proj holds this rank's Hq / dcp heads (TpDims::o_heads).
    RETURN_IF_ERROR(CheckSize(src.o_proj, dense * H * (Hq / options_.dcp.size) * D, p + "o_proj"));
    RETURN_IF_ERROR(CheckSize(src.post_attention_layernorm, H, p + "post_attention_layernorm"));
    const bool moe = config_.IsMoeLayer(static_cast<int64_t>(l));  // no dense MLP tensors
    RETURN_IF_ERROR(CheckSize(src.gate_up_proj, moe ? 0 : dense * 2 * I * H, p + "gate_up_proj"));
    RETURN_IF_ERROR(CheckSize(src.down_proj, moe ? 0 : dense * H * I, p + "down_proj"));
    RETURN_IF_ERROR(CheckSize(src.q_norm, config_.qk_norm ? D : 0, p + "q_norm"));
    RETURN_IF_ERROR(CheckSize(src.k_norm, config_.qk_norm ? D : 0, p + "k_norm"));
    if (config_.qkv_bias) RETURN_IF_ERROR(CheckSize(src.qkv_bias, qkv_dim, p + "qkv_bias"));
    if (config_.o_bias && row_bias) RETURN_IF_ERROR(CheckSize(src.o_bias, H, p + "o_bias"));
    if (config_.mlp_bias) {
      RETURN_IF_ERROR(CheckSize(src.gate_up_bias, 2 * I, p + "gate_up_bias"));
      if (row_bias) RETURN_IF_ERROR(CheckSize(src.down_bias, H, p + "down_bias"));
    }
    Layer& dst = layers_[l];
    ASSIGN_OR_RETURN(dst.input_layernorm,
                     UploadTensor(&src.input_layernorm, dt, &staging, "input_layernorm", stream));
    ASSIGN_OR_RETURN(dst.qkv_proj, UploadTensor(&src.qkv_proj, dt, &staging, "qkv_proj", stream));
    ASSIGN_OR_RETURN(dst.qkv_bias, UploadTensor(&src.qkv_bias, dt, &staging, "qkv_bias", stream));
    ASSIGN_OR_RETURN(dst.o_proj, UploadTensor(&src.o_proj, dt, &staging, "o_proj", stream));
    ASSIGN_OR_RETURN(dst.o_bias, UploadTensor(&src.o_bias, dt, &staging, "o_bias", stream));
    ASSIGN_OR_RETURN(dst.post_attention_layernorm,
                     UploadTensor(&src.post_attention_layernorm, dt, &staging,
                                  "post_attention_layernorm", stream));
    ASSIGN_OR_RETURN(dst.gate_up_proj,
                     UploadTensor(&src.gate_up_proj, dt, &staging, "gate_up_proj", stream));
    ASSIGN_OR_RETURN(dst.gate_up_bias,
                     UploadTensor(&src.gate_up_bias, dt, &staging, "gate_up_bias", stream));
    ASSIGN_OR_RETURN(dst.down_proj,
                     UploadTensor(&src.down_proj, dt, &staging, "down_proj", stream));
    ASSIGN_OR_RETURN(dst.down_bias,
                     UploadTensor(&src.down_bias, dt, &staging, "down_bias", stream));
    ASSIGN_OR_RETURN(dst.q_norm, UploadTensor(&src.q_norm, dt, &staging, "q_norm", stream));
    ASSIGN_OR_RETURN(dst.k_norm, UploadTensor(&src.k_norm, dt, &staging, "k_norm", stream));
    if (fp8) RETURN_IF_ERROR(UploadFp8(&src, &dst));
    if (moe && dt == ActDtype::kBf16) {
      ASSIGN_OR_RETURN(dst.moe, UploadMoeWeights<__nv_bfloat16>(config_, &src, stream));
    } else if (moe) {
      ASSIGN_OR_RETURN(dst.moe, UploadMoeWeights<__half>(config_, &src, stream));
    }
  }
  weight_bytes_ = 0;
  auto add = [&](const DeviceBuffer& b) { weight_bytes_ += b.bytes(); };
  add(embed_tokens_);
  add(norm_);
  add(lm_head_);
  weight_bytes_ += lm_head_fp8_.bytes();
  for (const Layer& l : layers_) {
    for (const DeviceBuffer* b :
         {&l.input_layernorm, &l.qkv_proj, &l.qkv_bias, &l.o_proj, &l.o_bias,
          &l.post_attention_layernorm, &l.gate_up_proj, &l.gate_up_bias, &l.down_proj, &l.down_bias,
          &l.q_norm, &l.k_norm}) {
      add(*b);
    }
    weight_bytes_ += l.moe.bytes() + l.qkv_fp8.bytes() + l.o_fp8.bytes() + l.gate_up_fp8.bytes() +
                     l.down_fp8.bytes();
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::AllocateActivations() {
  const int64_t T = options_.max_tokens, R = options_.max_logit_rows;
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t D = config_.head_dim, Hq = config_.num_attention_heads,
                Hk = config_.num_key_value_heads;
  const int64_t es = ActBytes(options_.dtype);
  ASSIGN_OR_RETURN(hidden_, DeviceBuffer::Allocate(T * H * es, "hidden"));
  ASSIGN_OR_RETURN(residual_, DeviceBuffer::Allocate(T * H * es, "residual"));
  ASSIGN_OR_RETURN(qkv_, DeviceBuffer::Allocate(T * (Hq + 2 * Hk) * D * es, "qkv"));
  ASSIGN_OR_RETURN(q_, DeviceBuffer::Allocate(T * Hq * D * es, "q"));
  ASSIGN_OR_RETURN(attn_, DeviceBuffer::Allocate(T * Hq * D * es, "attn"));
  ASSIGN_OR_RETURN(gate_up_, DeviceBuffer::Allocate(T * 2 * I * es, "gate_up"));
  ASSIGN_OR_RETURN(act_, DeviceBuffer::Allocate(T * I * es, "act"));
  ASSIGN_OR_RETURN(last_, DeviceBuffer::Allocate(R * H * es, "last"));
  ASSIGN_OR_RETURN(logits_, DeviceBuffer::Allocate(R * config_.vocab_size * int64_t{4}, "logits"));
  if (!lm_head_fp8_.empty()) {
    ASSIGN_OR_RETURN(lm_head_out_, DeviceBuffer::Allocate(R * vocab_rows_ * es, "lm_head out"));
  }
  if (config_.IsMoe()) {
    // Data-parallel attention: the layer's experts see the rows of every rank.
    const int64_t ranks = options_.moe_comm == nullptr ? 1 : options_.moe_comm->size();
    ASSIGN_OR_RETURN(moe_, CudaMoeMlp::Create(config_, T * ranks));
    if (options_.moe_comm != nullptr) RETURN_IF_ERROR(moe_->UseAllToAll(options_.moe_comm, T));
  }
  if (options_.dcp.size > 1) {
    ASSIGN_OR_RETURN(dcp_exchange_, CudaDcpExchange::Create(options_.dcp, comm(), T, Hq, D, es));
  }
  if (comm() != nullptr) {
    ASSIGN_OR_RETURN(local_logits_,
                     DeviceBuffer::Allocate(R * vocab_rows_ * int64_t{4}, "local logits"));
    ASSIGN_OR_RETURN(
        gathered_logits_,
        DeviceBuffer::Allocate(comm()->size() * R * vocab_rows_ * int64_t{4}, "gathered logits"));
  }
  return absl::OkStatus();
}

kernels::KvCacheLayout CudaLlamaModel::KvLayout(int64_t num_blocks, int64_t block_size) const {
  return KvLayoutForModel(config_, num_blocks, block_size);
}

absl::Status CudaLlamaModel::SetKvScales(const ModelWeights& weights) {
  const int64_t L = config_.num_hidden_layers;
  std::vector<float> scales(2 * L, kFp8KvTensorScale);  // K of every layer, then V
  for (int64_t l = 0; l < L && l < static_cast<int64_t>(weights.layers.size()); ++l) {
    const LayerWeights& w = weights.layers[l];
    if (w.kv_k_scale > 0.0f) scales[l] = w.kv_k_scale;
    if (w.kv_v_scale > 0.0f) scales[L + l] = w.kv_v_scale;
  }
  ASSIGN_OR_RETURN(kv_scales_, DeviceBuffer::Allocate(scales.size() * sizeof(float), "KV scales"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(kv_scales_.data(), scales.data(), scales.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

kc::DeviceKvCache CudaLlamaModel::LayerKv(const kc::DeviceKvCache& cache, int64_t l) const {
  kc::DeviceKvCache view = cache;
  if (cache.dtype == kc::KvDtype::kFp8E4m3 && !kv_scales_.empty()) {
    view.k_scale = kv_scales_.get<float>() + l;
    view.v_scale = kv_scales_.get<float>() + config_.num_hidden_layers + l;
  }
  return view;
}

kc::KvDtype CudaLlamaModel::kv_dtype() const {
  if (options_.fp8_kv) return kc::KvDtype::kFp8E4m3;
  return options_.dtype == ActDtype::kBf16 ? kc::KvDtype::kBf16 : kc::KvDtype::kFp16;
}

absl::Status CudaLlamaModel::Forward(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                     const StepAttentionPlan& plan, void* attn_workspace,
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
  if (options_.dcp.size > 1 && (plan.use_prefill || step.attention.local_seq_lens == nullptr)) {
    return absl::InvalidArgumentError(
        "Forward: DCP needs a decode-kernel plan and attention.local_seq_lens");
  }
  if (options_.dtype == ActDtype::kBf16) {
    return ForwardT<__nv_bfloat16>(step, cache, plan, attn_workspace, stream);
  }
  return ForwardT<__half>(step, cache, plan, attn_workspace, stream);
}

absl::Status CudaLlamaModel::ForwardIdle(cudaStream_t stream) {
  if (options_.moe_comm == nullptr || moe_ == nullptr) {
    return absl::FailedPreconditionError("ForwardIdle: not a data-parallel attention MoE rank");
  }
  return moe_->ForwardIdle([this](int64_t l) -> const CudaMoeWeights& { return layers_[l].moe; },
                           options_.dtype == ActDtype::kBf16, *gemm_, stream);
}

template <typename T>
absl::Status CudaLlamaModel::ForwardT(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                      const StepAttentionPlan& plan, void* attn_workspace,
                                      cudaStream_t stream) {
  const int64_t Tn = step.num_tokens, R = step.num_logit_rows;
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, V = config_.vocab_size;
  const int64_t D = config_.head_dim, Hq = config_.num_attention_heads,
                Hk = config_.num_key_value_heads;
  const int64_t q_dim = Hq * D, kv_dim = Hk * D, qkv_dim = q_dim + 2 * kv_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  T* hidden = Ptr<T>(hidden_);
  T* residual = Ptr<T>(residual_);
  T* qkv = Ptr<T>(qkv_);
  // o_proj's input width: this rank's heads after the DCP exchange, else all of attn_.
  const int64_t o_dim = q_dim / options_.dcp.size;

  const bool pdl = options_.programmatic_launch;
  if (comm() == nullptr) {
    RETURN_IF_ERROR(
        kc::Embedding<T>(step.token_ids, Tn, Ptr<T>(embed_tokens_), V, H, residual, stream));
  } else {
    RETURN_IF_ERROR(kc::VocabShardEmbedding<T>(step.token_ids, Tn, Ptr<T>(embed_tokens_),
                                               vocab_begin_, vocab_rows_, H, residual, stream));
  }
  // True while hidden holds this rank's partial down_proj sums: the next norm all-reduces them
  // (fused with its add + norm where the communicator can: ReduceAddNorm).
  bool hidden_partial = false;
  const bool fold = FoldsNorms(Tn);  // then residual_ holds the stream after every layer
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const kc::DeviceKvCache layer_kv = LayerKv(cache, l);  // an FP8 pool: this layer's scales
    if (fold) {
      RETURN_IF_ERROR(FoldedLayer<T>(step, layer_kv, l, plan, attn_workspace, stream));
      continue;
    }
    const Layer& w = layers_[l];
    // Layer 0: residual = the (all-reduced) embedding rows; then residual += hidden.
    const bool reduce_in = l == 0 ? comm() != nullptr : hidden_partial;
    const bool qkv_codes = FusesFp8Quant(w.qkv_fp8, Tn, H, reduce_in);  // FP8: norm + quant
    if (qkv_codes) {
      RETURN_IF_ERROR(AddNormQuantFp8(l > 0, w.input_layernorm, w.qkv_fp8, Tn, eps, stream));
    } else {
      RETURN_IF_ERROR(
          ReduceAddNorm<T>(reduce_in, l > 0, Ptr<T>(w.input_layernorm), Tn, eps, stream));
    }
    hidden_partial = false;
    RETURN_IF_ERROR(Project<T>(w.qkv_proj, w.qkv_fp8, hidden, w.qkv_bias, Tn, qkv_dim, H, qkv,
                               stream, qkv_codes));
    ASSIGN_OR_RETURN(const T* o_in,
                     AttendFromQkv<T>(step, layer_kv, l, plan, attn_workspace, stream));
    RETURN_IF_ERROR(Project<T>(w.o_proj, w.o_fp8, o_in, w.o_bias, Tn, H, o_dim, hidden, stream));
    const bool gate_up_codes =
        !config_.IsMoeLayer(l) && FusesFp8Quant(w.gate_up_fp8, Tn, H, comm() != nullptr);
    if (gate_up_codes) {
      RETURN_IF_ERROR(
          AddNormQuantFp8(true, w.post_attention_layernorm, w.gate_up_fp8, Tn, eps, stream));
    } else {
      RETURN_IF_ERROR(ReduceAddNorm<T>(comm() != nullptr, true, Ptr<T>(w.post_attention_layernorm),
                                       Tn, eps, stream));
    }
    if (config_.IsMoeLayer(l)) {  // the rank's slices of every expert; summed like down_proj
      RETURN_IF_ERROR(moe_->Forward<T>(w.moe, hidden, Tn, l, hidden, *gemm_, stream));
      if (comm() != nullptr) RETURN_IF_ERROR(AllReduce(hidden, Tn * H, stream));
      continue;
    }
    // FP8: SiLU-and-mul writes down_proj's per-token codes itself.
    const bool down_codes =
        !w.gate_up_fp8.empty() && FusesFp8Quant(w.down_fp8, Tn, I, false, /*silu=*/true);
    if (w.gate_up_fp8.empty() && UseGemv(hidden, Ptr<T>(w.gate_up_proj), Tn, 2 * I, H)) {
      // SiLU*up in the gate_up GEMV's epilogue (bit-identical to the two kernels below).
      RETURN_IF_ERROR(kc::SmallMLinearSiluMul<T>(hidden, Ptr<T>(w.gate_up_proj),
                                                 Ptr<T>(w.gate_up_bias), Tn, I, H, Ptr<T>(act_),
                                                 stream, pdl));
    } else {
      RETURN_IF_ERROR(Project<T>(w.gate_up_proj, w.gate_up_fp8, hidden, w.gate_up_bias, Tn, 2 * I,
                                 H, Ptr<T>(gate_up_), stream, gate_up_codes));
      if (down_codes) {
        RETURN_IF_ERROR(SiluAndMulQuantFp8(w.down_fp8, Tn, stream));
      } else {
        RETURN_IF_ERROR(kc::SiluAndMul<T>(Ptr<T>(gate_up_), Tn, I, Ptr<T>(act_), stream));
      }
    }
    RETURN_IF_ERROR(Project<T>(w.down_proj, w.down_fp8, Ptr<T>(act_), w.down_bias, Tn, H, I, hidden,
                               stream, down_codes));
    hidden_partial = comm() != nullptr;
  }
  RETURN_IF_ERROR(ReduceAddNorm<T>(hidden_partial, !fold, Ptr<T>(norm_), Tn, eps, stream));
  if (R == 0) return absl::OkStatus();
  RETURN_IF_ERROR(kc::GatherRows<T>(hidden, H, step.logit_rows, R, Ptr<T>(last_), stream));
  const DeviceBuffer& lm_head = lm_head_.empty() ? embed_tokens_ : lm_head_;
  // Without a communicator the whole vocabulary into logits_, else this rank's rows, gathered.
  float* out = comm() == nullptr ? logits_.get<float>() : local_logits_.get<float>();
  if (!lm_head_fp8_.empty()) {
    RETURN_IF_ERROR(LmHeadFp8(R, out, stream));
  } else {
    RETURN_IF_ERROR(DenseLinear(*gemm_, Ptr<T>(last_), Ptr<T>(lm_head),
                                static_cast<const T*>(nullptr), R,
                                comm() == nullptr ? V : vocab_rows_, H, out, stream, pdl));
  }
  if (comm() == nullptr || !gather_logits_) return absl::OkStatus();  // GreedyTokens: local
  return GatherLogits(R, stream);
}

template <typename T>
absl::StatusOr<const T*> CudaLlamaModel::AttendFromQkv(const DeviceStep& step,
                                                       const kc::DeviceKvCache& cache, int64_t l,
                                                       const StepAttentionPlan& plan,
                                                       void* attn_workspace, cudaStream_t stream) {
  const int64_t Tn = step.num_tokens, D = config_.head_dim, Hq = config_.num_attention_heads;
  const int64_t qkv_dim = (Hq + 2 * config_.num_key_value_heads) * D;
  T* qkv = Ptr<T>(qkv_);
  if (config_.qk_norm && options_.qk_norm_rope) {  // Qwen3: the head norms in the RoPE kernel
    RETURN_IF_ERROR(kc::QkNormRopeQkvToCache<T>(
        qkv, qkv_dim, step.positions, step.slot_mapping, Tn, inv_freq_.get<float>(), Hq,
        Ptr<T>(layers_[l].q_norm), Ptr<T>(layers_[l].k_norm),
        static_cast<float>(config_.rms_norm_eps), Ptr<T>(q_), cache, l, stream,
        options_.programmatic_launch));
    return Attention<T>(step, cache, l, plan, attn_workspace, stream);
  }
  if (config_.qk_norm) {  // Qwen3: RMSNorm over each q and k head, before RoPE
    RETURN_IF_ERROR(kc::QkHeadRmsNorm<T>(qkv, qkv_dim, Tn, Hq, config_.num_key_value_heads, D,
                                         Ptr<T>(layers_[l].q_norm), Ptr<T>(layers_[l].k_norm),
                                         static_cast<float>(config_.rms_norm_eps), stream));
  }
  // RoPE on q and k, rotated k and v into their pool slots, q dense for attention: one kernel.
  RETURN_IF_ERROR(kc::RopeQkvToCache<T>(qkv, qkv_dim, step.positions, step.slot_mapping, Tn,
                                        inv_freq_.get<float>(), Hq, Ptr<T>(q_), cache, l, stream,
                                        options_.programmatic_launch));
  return Attention<T>(step, cache, l, plan, attn_workspace, stream);
}

// FoldedLayer (cuda_llama_model_fold.cc) calls it too.
template absl::StatusOr<const __nv_bfloat16*> CudaLlamaModel::AttendFromQkv<__nv_bfloat16>(
    const DeviceStep&, const kc::DeviceKvCache&, int64_t, const StepAttentionPlan&, void*,
    cudaStream_t);
template absl::StatusOr<const __half*> CudaLlamaModel::AttendFromQkv<__half>(
    const DeviceStep&, const kc::DeviceKvCache&, int64_t, const StepAttentionPlan&, void*,
    cudaStream_t);

bool CudaLlamaModel::FoldsNorms(int64_t Tn) const {
  if (!options_.fold_norm || comm() != nullptr || options_.moe_comm != nullptr || layers_.empty()) {
    return false;
  }
  // MoE models (FoldedLayer's MoE layers): bf16, one GPU, no FP8, no expert placement.
  if (config_.IsMoe() &&
      (!options_.fold_moe || options_.dtype != ActDtype::kBf16 || fp8_ != nullptr ||
       moe_ == nullptr || config_.expert_placement != nullptr)) {
    return false;
  }
  if (fp8_ != nullptr) return FoldsFp8(Tn);
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, D = config_.head_dim;
  const int64_t q_dim = config_.num_attention_heads * D;
  const int64_t qkv_dim = q_dim + 2 * config_.num_key_value_heads * D;
  const Layer& w = layers_[0];  // every layer's attention buffers are allocated alike
  if (!UseGemv(residual_.data(), w.qkv_proj.data(), Tn, qkv_dim, H) ||
      !kc::SmallMLinearNormInSupported(residual_.data(), w.input_layernorm.data(),
                                       w.qkv_proj.data(), Tn, qkv_dim, H) ||
      !UseGemv(attn_.data(), w.o_proj.data(), Tn, H, q_dim)) {
    return false;
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (config_.IsMoeLayer(l)) continue;  // a plain RMSNorm and the MoE MLP: any Tn
    const Layer& d = layers_[l];          // the dense MLPs' buffers are allocated alike
    return kc::SmallMLinearNormInSupported(residual_.data(), d.post_attention_layernorm.data(),
                                           d.gate_up_proj.data(), Tn, 2 * I, H) &&
           UseGemv(act_.data(), d.down_proj.data(), Tn, H, I);
  }
  return true;
}

bool CudaLlamaModel::FoldsRope(int64_t Tn) const {
  return options_.fold_rope && !config_.qk_norm && config_.head_dim % 2 == 0 && fp8_ == nullptr &&
         FoldsNorms(Tn);
}

template <typename T>
absl::Status CudaLlamaModel::Project(const DeviceBuffer& dense, const CudaFp8Weight& fp8,
                                     const T* a, const DeviceBuffer& bias, int64_t m, int64_t n,
                                     int64_t k, T* out, cudaStream_t stream, bool fp8_codes_ready) {
  if (fp8.empty()) {
    return DenseLinear(*gemm_, a, Ptr<T>(dense), Ptr<T>(bias), m, n, k, out, stream,
                       options_.programmatic_launch);
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return fp8_->Linear(a, fp8, Ptr<T>(bias), m, out, stream, options_.programmatic_launch,
                        fp8_codes_ready);
  } else {
    return absl::InternalError("FP8 projections need bf16 activations");  // refused in Create
  }
}

template <typename T>
absl::StatusOr<const T*> CudaLlamaModel::Attention(const DeviceStep& step,
                                                   const kc::DeviceKvCache& cache, int64_t l,
                                                   const StepAttentionPlan& plan,
                                                   void* attn_workspace, cudaStream_t stream) {
  kernels::AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  if (plan.use_prefill) {
    RETURN_IF_ERROR(kc::PagedPrefillAttention<T>(Ptr<T>(q_), cache, l, step.attention, params,
                                                 plan.prefill, Ptr<T>(attn_), nullptr,
                                                 attn_workspace, stream));
    return Ptr<T>(attn_);
  }
  if (dcp_exchange_ == nullptr) {
    RETURN_IF_ERROR(kc::PagedAttention<T>(Ptr<T>(q_), cache, l, step.attention, params, plan.decode,
                                          Ptr<T>(attn_), nullptr, attn_workspace, stream));
    return Ptr<T>(attn_);
  }
  // DCP: this shard's partial over all the slice's heads, then one all-to-all + LSE merge.
  params.dcp_size = options_.dcp.size;
  params.dcp_rank = options_.dcp.rank;
  params.dcp_interleave = options_.dcp.interleave;
  RETURN_IF_ERROR(kc::PagedAttention<T>(Ptr<T>(q_), cache, l, step.attention, params, plan.decode,
                                        Ptr<T>(attn_), dcp_exchange_->lse(), attn_workspace,
                                        stream));
  RETURN_IF_ERROR(dcp_exchange_->Exchange<T>(Ptr<T>(attn_), step.num_tokens, stream));
  return dcp_exchange_->merged<T>();
}

// FoldedLayer (cuda_llama_model_fold.cc) calls it too.
template absl::StatusOr<const __nv_bfloat16*> CudaLlamaModel::Attention<__nv_bfloat16>(
    const DeviceStep&, const kc::DeviceKvCache&, int64_t, const StepAttentionPlan&, void*,
    cudaStream_t);
template absl::StatusOr<const __half*> CudaLlamaModel::Attention<__half>(const DeviceStep&,
                                                                         const kc::DeviceKvCache&,
                                                                         int64_t,
                                                                         const StepAttentionPlan&,
                                                                         void*, cudaStream_t);

template <typename T>
absl::Status CudaLlamaModel::ReduceAddNorm(bool reduce, bool add, const T* weight, int64_t Tn,
                                           float eps, cudaStream_t stream) {
  T* hidden = Ptr<T>(hidden_);
  T* residual = Ptr<T>(residual_);
  const int64_t H = config_.hidden_size;
  if (reduce) {
    comm::AddRmsNormArgs a;
    a.in = add ? hidden : residual;
    a.residual = residual;
    a.weight = weight;
    a.out = hidden;
    a.rows = Tn;
    a.hidden = H;
    a.eps = eps;
    a.add_residual = add;
    const comm::CommDtype dtype =
        options_.dtype == ActDtype::kBf16 ? comm::CommDtype::kBf16 : comm::CommDtype::kF16;
    ASSIGN_OR_RETURN(const bool fused, comm()->AllReduceAddRmsNorm(a, dtype, stream));
    if (fused) return absl::OkStatus();
    RETURN_IF_ERROR(AllReduce(add ? hidden : residual, Tn * H, stream));
  }
  const bool pdl = options_.programmatic_launch;
  if (add) return kc::FusedAddRmsNorm<T>(hidden, residual, weight, Tn, H, eps, stream, pdl);
  return kc::RmsNorm<T>(residual, weight, Tn, H, eps, hidden, stream, pdl);
}

absl::Status CudaLlamaModel::AllReduce(void* data, int64_t n, cudaStream_t stream) {
  const comm::CommDtype dtype =
      options_.dtype == ActDtype::kBf16 ? comm::CommDtype::kBf16 : comm::CommDtype::kF16;
  return comm()->AllReduceSum(data, n, dtype, stream);
}

absl::Status CudaLlamaModel::GatherLogits(int64_t R, cudaStream_t stream) {
  const int64_t P = vocab_rows_, V = config_.vocab_size, n = comm()->size();
  RETURN_IF_ERROR(comm()->AllGather(local_logits_.data(), gathered_logits_.data(), R * P,
                                    comm::CommDtype::kF32, stream));
  // [rank][row][P] -> [row][V]: rank r's block is columns r*P .. of every row.
  for (int64_t r = 0; r < n; ++r) {
    const int64_t cols = std::min(P, V - r * P);
    if (cols <= 0) continue;
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(logits_.get<float>() + r * P, V * 4,
                                           gathered_logits_.get<float>() + r * R * P, P * 4,
                                           cols * 4, R, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::GreedyTokens(int64_t R, const kc::DeviceSamplingRow* rows,
                                          int32_t* out, cudaStream_t stream) {
  if (!vocab_parallel() || gather_logits_) {
    return absl::FailedPreconditionError("GreedyTokens: the step's logits were gathered");
  }
  // logits_ is not written on this path: it holds this rank's candidates, gathered_logits_
  // every rank's ([ranks, R], far below either buffer's size).
  auto* mine = reinterpret_cast<kernels::ShardCandidate*>(logits_.data());
  auto* all = reinterpret_cast<kernels::ShardCandidate*>(gathered_logits_.data());
  RETURN_IF_ERROR(kc::ShardArgmaxRows(local_logits_.get<float>(), R, vocab_rows_, vocab_begin_,
                                      config_.vocab_size, rows, mine, stream));
  RETURN_IF_ERROR(comm()->AllGather(mine, all, R * 2, comm::CommDtype::kF32, stream));
  return kc::PickShardCandidates(all, comm()->size(), R, out, stream);
}

}  // namespace tandem::runtime::cuda
