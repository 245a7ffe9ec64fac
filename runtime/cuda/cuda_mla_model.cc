#include "runtime/cuda/cuda_mla_model.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/convert_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/rope.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_prefill_select.h"
#include "runtime/cuda/dense_linear.h"
#include "runtime/cuda/dummy_init.h"
#include "runtime/engine/kv_layout.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// Split-KV partials beyond the unsplit workspace (PlanMla caps the splits to fit).
constexpr int64_t kSplitWorkspaceBytes = int64_t{256} << 20;
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
// The unabsorbed prefill's workspace: context rows for kUnabsorbedRowsPerToken x max_tokens (the
// form wins prefills whose prefix is short next to the chunk: mla_prefill_select.h), at most
// kUnabsorbedWorkspaceBytes (a row: ~2 Hq (Dn + Dr) values; 12 KiB at 16 heads of DeepSeek's
// widths, 98 KiB at 128).
constexpr int64_t kUnabsorbedRowsPerToken = 2;
constexpr int64_t kUnabsorbedWorkspaceBytes = int64_t{512} << 20;

// TANDEM_MLA_PREWAIT=1 (read once; default off, an A/B of issue 33): kRows16's PDL launch with its
// prologue before griddepcontrol.wait (kc::MlaPlanInput::prewait).
bool MlaPrewaitFromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_MLA_PREWAIT");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// TANDEM_MLA_CLUSTER_MERGE (read once; default on, =0 turns it off for an A/B): kRows16 merges its
// splits through a thread-block cluster and DSMEM (kc::MlaPlanInput::cluster_merge; the plan falls
// back where invalid).
bool MlaClusterMergeFromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_MLA_CLUSTER_MERGE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// TANDEM_MLA_ROWS16_FP8 (read once; default on, =0 off for an A/B): an FP8 latent pool's kRows16
// steps on the 16-row FP8 kernel (MlaPlanInput::rows16_fp8), else the 64-row FP8 kernel.
bool MlaRows16Fp8FromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_MLA_ROWS16_FP8");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// TANDEM_MLA_ROWS16_MAX_REQUESTS (read once; an A/B): overrides
// CudaModelOptions::mla_rows16_max_requests and the planner's bound when set to a number >= 0.
std::optional<int64_t> MlaRows16MaxRequestsFromEnv() {
  static const std::optional<int64_t> n = []() -> std::optional<int64_t> {
    const char* v = std::getenv("TANDEM_MLA_ROWS16_MAX_REQUESTS");
    int64_t parsed = 0;
    if (v == nullptr || !absl::SimpleAtoi(v, &parsed) || parsed < 0) return std::nullopt;
    return parsed;
  }();
  return n;
}

kernels::MlaDims DimsOf(const ModelConfig& c) {
  return {c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank,
          c.v_head_dim};
}

// DeepSeek's yarn_apply_mscale: (Dn + Dr)^-0.5, times mscale(factor, mscale_all_dim)^2 for a
// non-default RoPE with mscale_all_dim set (runtime/cpu/mla_model.cc).
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
  if (config.quantization.lm_head) {
    return absl::InvalidArgumentError(
        "an FP8 lm_head (--quantize_lm_head) is supported for Llama-family models, not MLA");
  }
  if (options.comm != nullptr && options.dummy_seed.has_value() && options.dummy_plan.empty()) {
    return absl::InvalidArgumentError(
        "device dummy weights of a tensor-parallel rank need its plan (DummyWeightPlan)");
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
  if (config.quantization.IsFp8()) {  // e4m3 projections (cuda_mla_model_fp8.cc)
    if (options.dtype != ActDtype::kBf16) {
      return absl::InvalidArgumentError(
          absl::StrCat("FP8 weights (", config.quantization.Describe(), ") of ",
                       config.architecture, " run on CUDA with bf16 activations only"));
    }
    const int64_t max_k =
        std::max({config.hidden_size, config.q_lora_rank,
                  config.num_attention_heads / options.dcp.size * config.v_head_dim,
                  dense_mlp ? config.intermediate_size : int64_t{0}});
    ASSIGN_OR_RETURN(model->fp8_, CudaFp8Linear::Create(options.max_tokens, max_k));
  }
  const int64_t n = options.comm == nullptr ? 1 : options.comm->size();
  model->vocab_rows_ = (config.vocab_size + n - 1) / n;
  model->vocab_begin_ = options.comm == nullptr ? 0 : options.comm->rank() * model->vocab_rows_;
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
  if (options.dummy_seed.has_value()) {
    if (!weights.layers.empty() || !weights.embed_tokens.empty()) {
      return absl::InvalidArgumentError("dummy weights requested but host weights were given");
    }
    RETURN_IF_ERROR(model->GenerateDummy(*options.dummy_seed, stream));
  } else {
    RETURN_IF_ERROR(model->Upload(std::move(weights), stream));
  }
  RETURN_IF_ERROR(model->Allocate(sms));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return model;
}

std::vector<CudaMlaModel::Tensor> CudaMlaModel::Tensors(ModelWeights* w) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, P = vocab_rows_;
  const int64_t Hq = dims_.num_heads, Rq = c.q_lora_rank, q_in = Rq > 0 ? Rq : H;
  auto host = [w](std::vector<float> ModelWeights::*f) {
    return w == nullptr ? nullptr : &(w->*f);
  };
  std::vector<Tensor> out = {
      {&embed_tokens_, WeightSlot::kEmbedTokens, -1, host(&ModelWeights::embed_tokens), P * H,
       "embed"},
      {&norm_, WeightSlot::kNorm, -1, host(&ModelWeights::norm), H, "norm"},
      {&lm_head_, WeightSlot::kLmHead, -1, host(&ModelWeights::lm_head),
       c.tie_word_embeddings ? 0 : P * H, "lm_head"},
  };
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer& d = layers_[l];
    LayerWeights* s = w == nullptr ? nullptr : &w->layers[l];
    auto src = [s](std::vector<float> LayerWeights::*f) {
      return s == nullptr ? nullptr : &(s->*f);
    };
    // An e4m3 projection (UploadFp8; dummy weights of an FP8 config) has no 16-bit tensor.
    auto or0 = [s, this](Fp8LinearWeight LayerWeights::*f, int64_t numel) {
      return (s != nullptr ? !(s->*f).empty() : fp8_ != nullptr) ? 0 : numel;
    };
    const bool moe = c.IsMoeLayer(l);  // no dense MLP tensors
    const Tensor layer[] = {
        {&d.input_layernorm, WeightSlot::kInputLayernorm, l, src(&LayerWeights::input_layernorm), H,
         "input_layernorm"},
        {&d.q_a_proj, WeightSlot::kMlaQAProj, l, src(&LayerWeights::q_a_proj),
         or0(&LayerWeights::q_a_fp8, Rq * H), "q_a_proj"},
        {&d.q_a_layernorm, WeightSlot::kMlaQALayernorm, l, src(&LayerWeights::q_a_layernorm), Rq,
         "q_a_layernorm"},
        {&d.q_proj, WeightSlot::kMlaQProj, l, src(&LayerWeights::q_proj),
         or0(&LayerWeights::q_fp8, Hq * dims_.QkHeadDim() * q_in), "q_proj"},
        {&d.kv_a_proj, WeightSlot::kMlaKvAProj, l, src(&LayerWeights::kv_a_proj),
         or0(&LayerWeights::kv_a_fp8, dims_.LatentDim() * H), "kv_a_proj_with_mqa"},
        {&d.kv_a_layernorm, WeightSlot::kMlaKvALayernorm, l, src(&LayerWeights::kv_a_layernorm),
         dims_.kv_lora_rank, "kv_a_layernorm"},
        {&d.kv_b_proj, WeightSlot::kMlaKvBProj, l, src(&LayerWeights::kv_b_proj),
         Hq * (dims_.qk_nope_head_dim + dims_.v_head_dim) * dims_.kv_lora_rank, "kv_b_proj"},
        {&d.o_proj, WeightSlot::kOProj, l, src(&LayerWeights::o_proj),
         or0(&LayerWeights::o_fp8, H * (Hq / options_.dcp.size) * dims_.v_head_dim),
         "o_proj"},  // DCP: TpDims::o_heads
        {&d.post_attention_layernorm, WeightSlot::kPostAttentionLayernorm, l,
         src(&LayerWeights::post_attention_layernorm), H, "post_attention_layernorm"},
        {&d.gate_up_proj, WeightSlot::kGateUpProj, l, src(&LayerWeights::gate_up_proj),
         moe ? 0 : or0(&LayerWeights::gate_up_fp8, 2 * I * H), "gate_up_proj"},
        {&d.down_proj, WeightSlot::kDownProj, l, src(&LayerWeights::down_proj),
         moe ? 0 : or0(&LayerWeights::down_fp8, H * I), "down_proj"},
    };
    out.insert(out.end(), std::begin(layer), std::end(layer));
  }
  return out;
}

absl::Status CudaMlaModel::Upload(ModelWeights w, cudaStream_t stream) {
  const ModelConfig& c = config_;
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", w.layers.size(),
                                                   " layers, config says ", c.num_hidden_layers));
  }
  DeviceBuffer staging;
  const ActDtype dt = options_.dtype;
  weight_bytes_ = 0;
  for (const Tensor& t : Tensors(&w)) {
    const std::string what = t.layer < 0 ? t.name : absl::StrCat("layer ", t.layer, " ", t.name);
    ASSIGN_OR_RETURN(*t.dst, UploadTensor(t.host, t.numel, dt, &staging, what, stream));
    weight_bytes_ += t.dst->bytes();
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights* s = &w.layers[l];
    if (fp8_ != nullptr) RETURN_IF_ERROR(UploadFp8(s, &layers_[l]));
    if (!c.IsMoeLayer(l)) continue;
    if (dt == ActDtype::kBf16) {
      ASSIGN_OR_RETURN(layers_[l].moe,
                       UploadMoeWeights<__nv_bfloat16>(c, s, stream, options_.max_tokens));
    } else {
      ASSIGN_OR_RETURN(layers_[l].moe, UploadMoeWeights<__half>(c, s, stream));
    }
    weight_bytes_ += layers_[l].moe.bytes();
  }
  return absl::OkStatus();
}

absl::Status CudaMlaModel::GenerateDummy(uint64_t seed, cudaStream_t stream) {
  // The rank's buffers, sized as Upload() checks them, zero-filled (vocabulary rows past the end
  // of the last partition stay zero), then every fill of the plan drawn where it lands.
  weight_bytes_ = 0;
  std::vector<Tensor> tensors = Tensors(nullptr);
  for (const Tensor& t : tensors) {
    if (t.numel == 0) continue;
    ASSIGN_OR_RETURN(*t.dst, DeviceBuffer::Allocate(t.numel * 2, t.name));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dst->data(), 0, t.dst->bytes(), stream));
    weight_bytes_ += t.dst->bytes();
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    ASSIGN_OR_RETURN(layers_[l].moe, AllocateMoeWeights(config_, stream, options_.max_tokens));
    weight_bytes_ += layers_[l].moe.bytes();
  }
  if (fp8_ != nullptr) RETURN_IF_ERROR(AllocateFp8Dummy());
  std::vector<DummyTensorFill> whole;
  if (options_.dummy_plan.empty()) {
    ASSIGN_OR_RETURN(whole, DummyWeightPlan(config_));
  }
  const bool bf16 = options_.dtype == ActDtype::kBf16;
  DeviceBuffer fp8_staging;  // FP8 configs: one fill's fp32 draw before quantization
  for (const DummyTensorFill& f : options_.dummy_plan.empty() ? whole : options_.dummy_plan) {
    if (IsMoeSlot(f.slot) && f.layer >= 0 && f.layer < config_.num_hidden_layers) {
      CudaMoeWeights* moe = &layers_[f.layer].moe;
      RETURN_IF_ERROR(bf16 ? FillMoeDummy<__nv_bfloat16>(f, seed, moe, &fp8_staging, stream)
                           : FillMoeDummy<__half>(f, seed, moe, &fp8_staging, stream));
      continue;
    }
    if (fp8_ != nullptr) {
      ASSIGN_OR_RETURN(const bool drawn, FillFp8DummyProjection(f, seed, &fp8_staging, stream));
      if (drawn) continue;
    }
    DeviceBuffer* b = nullptr;
    for (const Tensor& t : tensors) {
      if (t.slot == f.slot && t.layer == f.layer) b = t.dst;
    }
    if (b == nullptr || (f.offset + f.slice.numel()) * 2 > b->bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dummy plan does not fit the MLA model: slot ", static_cast<int>(f.slot),
                       " layer ", f.layer, " elements [", f.offset, ", ",
                       f.offset + f.slice.numel(), ") of ", b == nullptr ? 0 : b->bytes() / 2));
    }
    RETURN_IF_ERROR(bf16 ? FillDummySlice(b->get<__nv_bfloat16>() + f.offset, f.slice, f.mean, seed,
                                          f.stream_id, stream)
                         : FillDummySlice(b->get<__half>() + f.offset, f.slice, f.mean, seed,
                                          f.stream_id, stream));
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
      {&ckv_, T * dims_.kv_lora_rank + dims_.qk_rope_head_dim, "c_kv (+ a GEMV's k_pe)"},
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
  if (comm() != nullptr) {
    ASSIGN_OR_RETURN(local_logits_, DeviceBuffer::Allocate(R * vocab_rows_ * 4, "local logits"));
    ASSIGN_OR_RETURN(gathered_logits_, DeviceBuffer::Allocate(comm()->size() * R * vocab_rows_ * 4,
                                                              "gathered logits"));
  }
  if (config_.IsMoe()) {  // data-parallel attention: the experts see the rows of every rank
    comm::DeviceCommunicator* moe_comm = options_.moe_comm;
    ASSIGN_OR_RETURN(moe_, CudaMoeMlp::Create(config_, T * (moe_comm ? moe_comm->size() : 1)));
    if (moe_comm != nullptr) RETURN_IF_ERROR(moe_->UseAllToAll(moe_comm, T));
  }
  if (options_.dcp.size > 1) {  // the shard's partial heads out, this rank's merged heads back
    ASSIGN_OR_RETURN(dcp_exchange_,
                     CudaDcpExchange::Create(options_.dcp, comm(), T, Hq, dims_.v_head_dim, 2));
  }
  kc::MlaPlanInput in{.dims = dims_,
                      .num_seqs = T,
                      .num_tokens = T,
                      .max_q_len = T,
                      .max_seq_len = 1,
                      .num_sms = num_sms_,
                      .num_splits = 1,
                      .workspace_zeroed = true};
  ASSIGN_OR_RETURN(const kc::MlaPlan unsplit, kc::PlanMla(in));
  ASSIGN_OR_RETURN(
      mla_workspace_,
      DeviceBuffer::Allocate(unsplit.workspace_bytes + kSplitWorkspaceBytes, "MLA workspace"));
  // The split merge's tickets (MlaPlanInput::workspace_zeroed): zero once; the kernel's merging
  // CTAs leave them zero after every call and graph replay.
  CUDA_RETURN_IF_ERROR(cudaMemset(mla_workspace_.data(), 0, kc::kMlaMergeCounterBytes));
  return AllocateUnabsorbed(T);
}

absl::Status CudaMlaModel::AllocateUnabsorbed(int64_t max_tokens) {
  if (options_.fp8_kv || options_.dcp.size > 1) return absl::OkStatus();
  // The workspace grows by the same bytes per context row whatever the batch (one request here;
  // a batch adds its (num_seqs + 1) starts: the slack).
  constexpr int64_t kSlack = int64_t{1} << 20;
  auto bytes = [&](int64_t rows) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(const kc::MlaUnabsorbedPlan p, kc::PlanMlaUnabsorbed({.dims = dims_,
                                                                           .num_seqs = 1,
                                                                           .num_tokens = max_tokens,
                                                                           .max_q_len = max_tokens,
                                                                           .max_seq_len = rows},
                                                                          rows));
    return p.workspace_bytes;
  };
  absl::StatusOr<int64_t> base = bytes(0);
  if (!base.ok()) return absl::OkStatus();  // widths the unabsorbed form does not take
  ASSIGN_OR_RETURN(const int64_t more, bytes(4096));
  const int64_t per_row = (more - *base + 4095) / 4096;
  const int64_t rows =
      std::min(kUnabsorbedRowsPerToken * max_tokens, (kUnabsorbedWorkspaceBytes - *base) / per_row);
  if (rows < max_tokens) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t need, bytes(rows));
  ASSIGN_OR_RETURN(unabsorbed_workspace_,
                   DeviceBuffer::Allocate(need + kSlack, "MLA unabsorbed prefill workspace"));
  unabsorbed_rows_ = rows;
  return absl::OkStatus();
}

kernels::KvCacheLayout CudaMlaModel::KvLayout(int64_t num_blocks, int64_t block_size) const {
  return KvLayoutForModel(config_, num_blocks, block_size);
}

kc::KvDtype CudaMlaModel::kv_dtype() const {
  if (options_.fp8_kv) return kc::KvDtype::kFp8E4m3;
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
                      .max_workspace_bytes = mla_workspace_.bytes(),
                      .dcp = options_.dcp,
                      .workspace_zeroed = true,  // the TMA kernel merges its splits
                      .rows16_small_batches = options_.mla_rows16,
                      .prewait = MlaPrewaitFromEnv(),
                      .cluster_merge = MlaClusterMergeFromEnv(),
                      .rows16_fp8 = MlaRows16Fp8FromEnv()};
  std::optional<int64_t> rows16_bound = MlaRows16MaxRequestsFromEnv();
  if (!rows16_bound.has_value()) rows16_bound = options_.mla_rows16_max_requests;
  if (rows16_bound.has_value()) in.rows16_max_requests = *rows16_bound;
  ASSIGN_OR_RETURN(const kc::MlaPlan mla, kc::PlanMla(in));
  if (mla.workspace_bytes > mla_workspace_.bytes()) {
    return absl::InternalError("Forward: the MLA workspace is too small for the step");
  }
  ASSIGN_OR_RETURN(step_unabsorbed_, ChooseUnabsorbed(in, stream));
  if (options_.dtype == ActDtype::kBf16) return ForwardT<__nv_bfloat16>(step, cache, mla, stream);
  return ForwardT<__half>(step, cache, mla, stream);
}

absl::StatusOr<std::optional<kc::MlaUnabsorbedPlan>> CudaMlaModel::ChooseUnabsorbed(
    const kc::MlaPlanInput& in, cudaStream_t stream) const {
  const kernels::MlaStepBounds bounds{.num_heads = dims_.num_heads,
                                      .num_seqs = in.num_seqs,
                                      .num_tokens = in.num_tokens,
                                      .max_seq_len = in.max_seq_len,
                                      .num_sms = num_sms_};
  const int64_t rows = kernels::MlaUnabsorbedContextRows(bounds);
  if (rows > unabsorbed_rows_ || !kernels::PreferUnabsorbedMla(bounds)) return std::nullopt;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return std::nullopt;  // graphs: decode-sized steps
  ASSIGN_OR_RETURN(const kc::MlaUnabsorbedPlan plan, kc::PlanMlaUnabsorbed(in, rows));
  if (plan.workspace_bytes > unabsorbed_workspace_.bytes()) return std::nullopt;
  return plan;
}

template <typename T>
absl::Status CudaMlaModel::Attention(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                     int64_t l, const kc::MlaPlan& plan, bool fold,
                                     cudaStream_t stream) {
  const Layer& w = layers_[l];
  const int64_t Tn = step.num_tokens, Hq = dims_.num_heads, Dqk = dims_.QkHeadDim();
  const int64_t L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim, Dn = dims_.qk_nope_head_dim;
  T* q = Ptr<T>(q_);
  // kv_a_layernorm inside the latent write (16-bit pools; bit-identical to RmsNorm + the write).
  const bool norm_in_write = options_.mla_norm_in_write && cache.dtype != kc::KvDtype::kFp8E4m3 &&
                             kc::MlaWriteLatentNormedSupported(dims_);
  // With it, k_pe's RoPE too (mla_rope_in_write: k_pe rotated on its way into the pool).
  const bool rope_in_write = norm_in_write && options_.mla_rope_in_write;
  ASSIGN_OR_RETURN(T* const kpe, ProjectQKv<T>(w, Tn, fold, norm_in_write, stream));
  const float* inv_freq = inv_freq_.get<float>();
  RETURN_IF_ERROR(kc::MlaRope<T>(step.positions, Tn, inv_freq, Dr, rope_factor_,
                                 config_.rope_interleave, q, Hq, Dqk, Dn, stream));
  if (!rope_in_write) {
    RETURN_IF_ERROR(kc::MlaRope<T>(step.positions, Tn, inv_freq, Dr, rope_factor_,
                                   config_.rope_interleave, kpe, 1, Dr, 0, stream));
  }
  if (cache.dtype == kc::KvDtype::kFp8E4m3) {  // e4m3 codes + one scale per row (mla_cuda.h)
    RETURN_IF_ERROR(kc::MlaWriteLatentFp8<T>(Ptr<T>(ckv_normed_), L, kpe, Dr, step.slot_mapping, Tn,
                                             dims_, cache, l, stream));
  } else if (norm_in_write) {
    const kc::MlaLatentRope rope{.positions = step.positions,
                                 .inv_freq = inv_freq,
                                 .attention_factor = rope_factor_,
                                 .interleave = config_.rope_interleave};
    RETURN_IF_ERROR(kc::MlaWriteLatentNormed<T>(
        Ptr<T>(ckv_), L, Ptr<T>(w.kv_a_layernorm), kLatentNormEps, kpe, Dr, step.slot_mapping, Tn,
        dims_, cache, l, stream, rope_in_write ? &rope : nullptr));
  } else {
    RETURN_IF_ERROR(kc::MlaWriteLatent<T>(Ptr<T>(ckv_normed_), L, kpe, Dr, step.slot_mapping, Tn,
                                          dims_, cache, l, stream));
  }
  if (step_unabsorbed_.has_value()) {  // a long prefill (ChooseUnabsorbed); no DCP
    return kc::MlaUnabsorbedAttention<T>(
        cublas_, q, Ptr<T>(w.kv_b_proj), cache, l, step.attention, softmax_scale_,
        *step_unabsorbed_, unabsorbed_workspace_.data(), Ptr<T>(attn_), nullptr, stream);
  }
  // DCP: this shard's partial over all the slice's heads with its LSE, then one all-to-all of
  // the group and the LSE merge into the rank's Hq / dcp heads (dcp_exchange_->merged()).
  RETURN_IF_ERROR(
      kc::MlaAbsorbedAttention<T>(cublas_, q, Ptr<T>(w.kv_b_proj), cache, l, step.attention,
                                  softmax_scale_, plan, mla_workspace_.data(), Ptr<T>(attn_),
                                  dcp_exchange_ != nullptr ? dcp_exchange_->lse() : nullptr, stream,
                                  {.pdl = options_.programmatic_launch}));
  if (dcp_exchange_ == nullptr) return absl::OkStatus();
  return dcp_exchange_->Exchange<T>(Ptr<T>(attn_), Tn, stream);
}

template <typename T>
absl::Status CudaMlaModel::ForwardT(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                    const kc::MlaPlan& plan, cudaStream_t stream) {
  const int64_t Tn = step.num_tokens, R = step.num_logit_rows;
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool pdl = options_.programmatic_launch;
  T* hidden = Ptr<T>(hidden_);
  T* residual = Ptr<T>(residual_);
  if (input_embeds_ != nullptr) {  // the MTP block (CudaMtpModel): eh_proj's output
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(residual, input_embeds_, Tn * H * sizeof(T),
                                         cudaMemcpyDeviceToDevice, stream));
  } else if (comm() == nullptr) {
    RETURN_IF_ERROR(
        kc::Embedding<T>(step.token_ids, Tn, Ptr<T>(embed_tokens_), V, H, residual, stream));
  } else {  // vocab-parallel: each rank its rows, summed
    RETURN_IF_ERROR(kc::VocabShardEmbedding<T>(step.token_ids, Tn, Ptr<T>(embed_tokens_),
                                               vocab_begin_, vocab_rows_, H, residual, stream));
    RETURN_IF_ERROR(AllReduce(residual, Tn * H, stream));
  }
  const bool fold = FoldsNorms(Tn);  // then residual_ holds the stream after every layer
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (fold) {
      RETURN_IF_ERROR(FoldedLayer<T>(step, cache, l, plan, stream));
      continue;
    }
    const Layer& w = layers_[l];
    if (l == 0) {
      RETURN_IF_ERROR(
          kc::RmsNorm<T>(residual, Ptr<T>(w.input_layernorm), Tn, H, eps, hidden, stream, pdl));
    } else {
      RETURN_IF_ERROR(kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(w.input_layernorm), Tn, H,
                                             eps, stream, pdl));
    }
    RETURN_IF_ERROR(Attention<T>(step, cache, l, plan, /*fold=*/false, stream));
    const T* attn = dcp_exchange_ != nullptr ? dcp_exchange_->merged<T>() : Ptr<T>(attn_);
    RETURN_IF_ERROR(Project(w.o_fp8, Ptr<T>(w.o_proj), attn, Tn, H,
                            dims_.num_heads / options_.dcp.size * dims_.v_head_dim, hidden,
                            stream));
    if (comm() != nullptr) RETURN_IF_ERROR(AllReduce(hidden, Tn * H, stream));  // row-parallel
    RETURN_IF_ERROR(kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(w.post_attention_layernorm), Tn,
                                           H, eps, stream, pdl));
    if (config_.IsMoeLayer(l)) {  // DeepSeek's MoE layer: routed + shared experts
      RETURN_IF_ERROR(moe_->Forward<T>(w.moe, hidden, Tn, l, hidden, *gemm_, stream));
      if (comm() != nullptr) RETURN_IF_ERROR(AllReduce(hidden, Tn * H, stream));
      continue;
    }
    if (w.gate_up_fp8.empty() && UseGemv(hidden, Ptr<T>(w.gate_up_proj), Tn, 2 * I, H)) {
      // SiLU*up in the gate_up GEMV's epilogue (bit-identical to the two kernels below).
      RETURN_IF_ERROR(kc::SmallMLinearSiluMul<T>(hidden, Ptr<T>(w.gate_up_proj), nullptr, Tn, I, H,
                                                 Ptr<T>(act_), stream, pdl));
    } else {
      RETURN_IF_ERROR(Project(w.gate_up_fp8, Ptr<T>(w.gate_up_proj), hidden, Tn, 2 * I, H,
                              Ptr<T>(gate_up_), stream));
      RETURN_IF_ERROR(kc::SiluAndMul<T>(Ptr<T>(gate_up_), Tn, I, Ptr<T>(act_), stream));
    }
    RETURN_IF_ERROR(
        Project(w.down_fp8, Ptr<T>(w.down_proj), Ptr<T>(act_), Tn, H, I, hidden, stream));
    if (comm() != nullptr) RETURN_IF_ERROR(AllReduce(hidden, Tn * H, stream));
  }
  if (fold) {  // residual_ is up to date: FusedAddRmsNorm's norm of it
    RETURN_IF_ERROR(kc::RmsNorm<T>(residual, Ptr<T>(norm_), Tn, H, eps, hidden, stream, pdl));
  } else {
    RETURN_IF_ERROR(
        kc::FusedAddRmsNorm<T>(hidden, residual, Ptr<T>(norm_), Tn, H, eps, stream, pdl));
  }
  if (R == 0) return absl::OkStatus();
  RETURN_IF_ERROR(kc::GatherRows<T>(hidden, H, step.logit_rows, R, Ptr<T>(last_), stream));
  const T* lm_head = Ptr<T>(lm_head_.bytes() == 0 ? embed_tokens_ : lm_head_);
  const bool local = comm() != nullptr;  // vocab-parallel: this rank's rows, then gathered
  RETURN_IF_ERROR(DenseLinear(*gemm_, Ptr<T>(last_), lm_head, static_cast<const T*>(nullptr), R,
                              local ? vocab_rows_ : V, H,
                              (local ? local_logits_ : logits_).get<float>(), stream, pdl));
  return local ? GatherLogits(R, stream) : absl::OkStatus();
}

absl::Status CudaMlaModel::ForwardIdle(cudaStream_t stream) {
  if (options_.moe_comm == nullptr || moe_ == nullptr) {
    return absl::FailedPreconditionError("ForwardIdle: not a data-parallel attention MoE rank");
  }
  return moe_->ForwardIdle([this](int64_t l) -> const CudaMoeWeights& { return layers_[l].moe; },
                           options_.dtype == ActDtype::kBf16, *gemm_, stream);
}

absl::Status CudaMlaModel::AllReduce(void* data, int64_t n, cudaStream_t stream) {
  const comm::CommDtype dtype =
      options_.dtype == ActDtype::kBf16 ? comm::CommDtype::kBf16 : comm::CommDtype::kF16;
  return comm()->AllReduceSum(data, n, dtype, stream);
}

absl::Status CudaMlaModel::GatherLogits(int64_t R, cudaStream_t stream) {
  const int64_t P = vocab_rows_, V = config_.vocab_size, n = comm()->size();
  RETURN_IF_ERROR(comm()->AllGather(local_logits_.data(), gathered_logits_.data(), R * P,
                                    comm::CommDtype::kF32, stream));
  // [rank][row][P] -> [row][V], the padding past the vocabulary dropped.
  for (int64_t r = 0; r < n && r * P < V; ++r) {
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        logits_.get<float>() + r * P, V * 4, gathered_logits_.get<float>() + r * R * P, P * 4,
        std::min(P, V - r * P) * 4, R, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime::cuda
