// CudaLlamaModel's FP8 projections (issue 38; cuda_fp8_linear.h): upload from the loader's
// *_fp8 slots, allocation for device dummy weights, the slot a dummy fill lands in, the
// producers of per-token FP8 inputs with the quantization fused in
// (kernels/fp8/fp8_fused_quant_cuda.h), and the layer of 1-8 tokens on the weight-only FP8 GEMVs
// with the norms folded in (kernels/fp8/fp8_w8a16_gemv_cuda.h).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/layers/cuda/convert_cuda.h"
#include "runtime/cuda/cuda_llama_model.h"

namespace tandem::runtime::cuda {
namespace {

// TANDEM_FP8_W16_MMA=deep / splitk (below): the FP8 linear's W8A16 GEMV takes the same math and
// its split-k workspace grows to weights of up to `weight_rows` rows.
absl::Status PrepareW16Latency(CudaFp8Linear* fp8, int64_t weight_rows);

}  // namespace

absl::Status CudaLlamaModel::UploadFp8(LayerWeights* src, Layer* dst) {
  // CudaModelOptions::fp8_weight_only_fold also picks CudaFp8Linear's batch-1 W8A16 GEMV for
  // weights with per-128-column scales (TANDEM_FP8_W16_GEMV=0 turns it off in any case).
  if (fp8_ != nullptr) fp8_->set_w8a16_gemv(fp8_->w8a16_gemv() && options_.fp8_weight_only_fold);
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, D = config_.head_dim;
  const int64_t qkv_dim = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * D;
  const int64_t o_dim = config_.num_attention_heads / options_.dcp.size * D;
  const int64_t T = options_.max_tokens;
  ASSIGN_OR_RETURN(dst->qkv_fp8, UploadFp8Weight(&src->qkv_fp8, qkv_dim, H, T, "qkv_proj"));
  ASSIGN_OR_RETURN(dst->o_fp8, UploadFp8Weight(&src->o_fp8, H, o_dim, T, "o_proj"));
  if (!src->gate_up_fp8.empty() || !src->down_fp8.empty()) {
    ASSIGN_OR_RETURN(dst->gate_up_fp8,
                     UploadFp8Weight(&src->gate_up_fp8, 2 * I, H, T, "gate_up_proj"));
    ASSIGN_OR_RETURN(dst->down_fp8, UploadFp8Weight(&src->down_fp8, H, I, T, "down_proj"));
  }
  return PrepareW16Latency(fp8_.get(), std::max({qkv_dim, H, 2 * I}));
}

absl::Status CudaLlamaModel::AllocateFp8(Layer* l) {
  // CudaModelOptions::fp8_weight_only_fold also picks CudaFp8Linear's batch-1 W8A16 GEMV for
  // weights with per-128-column scales (TANDEM_FP8_W16_GEMV=0 turns it off in any case).
  if (fp8_ != nullptr) fp8_->set_w8a16_gemv(fp8_->w8a16_gemv() && options_.fp8_weight_only_fold);
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, D = config_.head_dim;
  const int64_t qkv_dim = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * D;
  const int64_t o_dim = config_.num_attention_heads / options_.dcp.size * D;
  const WeightQuantization& q = config_.quantization;
  const int64_t T = options_.max_tokens;
  ASSIGN_OR_RETURN(l->qkv_fp8, AllocateFp8DummyWeight(q, qkv_dim, H, T));
  ASSIGN_OR_RETURN(l->o_fp8, AllocateFp8DummyWeight(q, H, o_dim, T));
  if (!config_.IsMoeLayer(l - layers_.data())) {  // a MoE layer's experts: AllocateMoeWeights
    ASSIGN_OR_RETURN(l->gate_up_fp8, AllocateFp8DummyWeight(q, 2 * I, H, T));
    ASSIGN_OR_RETURN(l->down_fp8, AllocateFp8DummyWeight(q, H, I, T));
  }
  weight_bytes_ +=
      l->qkv_fp8.bytes() + l->o_fp8.bytes() + l->gate_up_fp8.bytes() + l->down_fp8.bytes();
  return PrepareW16Latency(fp8_.get(), std::max({qkv_dim, H, 2 * I}));
}

CudaFp8Weight* CudaLlamaModel::Fp8Slot(WeightSlot slot, int64_t layer) {
  if (slot == WeightSlot::kLmHead && layer < 0) {
    return lm_head_fp8_.empty() ? nullptr : &lm_head_fp8_;
  }
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return nullptr;
  Layer& l = layers_[static_cast<size_t>(layer)];
  CudaFp8Weight* w = slot == WeightSlot::kQkvProj      ? &l.qkv_fp8
                     : slot == WeightSlot::kOProj      ? &l.o_fp8
                     : slot == WeightSlot::kGateUpProj ? &l.gate_up_fp8
                     : slot == WeightSlot::kDownProj   ? &l.down_fp8
                                                       : nullptr;
  return w != nullptr && !w->empty() ? w : nullptr;
}

bool CudaLlamaModel::FusesFp8Quant(const CudaFp8Weight& fp8, int64_t Tn, int64_t width, bool reduce,
                                   bool silu) const {
  // SiLU-and-mul fuses per-token codes only (kernels/fp8/fp8_fused_quant_cuda.h).
  if (silu && fp8.activation != kernels::Fp8ActivationScheme::kDynamicToken) return false;
  return !reduce && fp8_ != nullptr && options_.dtype == ActDtype::kBf16 &&
         fp8_->TakesTokenCodes(fp8, Tn) && kernels::cuda::Fp8FusedQuantSupported(width);
}

absl::Status CudaLlamaModel::AddNormQuantFp8(bool add, const DeviceBuffer& weight,
                                             const CudaFp8Weight& fp8, int64_t Tn, float eps,
                                             cudaStream_t stream) {
  using bf16 = __nv_bfloat16;
  bf16* hidden = hidden_.get<bf16>();
  bf16* residual = residual_.get<bf16>();
  // As ReduceAddNorm: with the add, residual += hidden and hidden = norm in place; without,
  // hidden = norm(residual).
  return kernels::cuda::RmsNormQuantFp8(add ? hidden : residual, add ? residual : nullptr,
                                        weight.get<bf16>(), Tn, config_.hidden_size, eps, hidden,
                                        fp8_->token_codes(fp8, Tn), stream,
                                        options_.programmatic_launch);
}

absl::Status CudaLlamaModel::SiluAndMulQuantFp8(const CudaFp8Weight& fp8, int64_t Tn,
                                                cudaStream_t stream) {
  return kernels::cuda::SiluAndMulQuantFp8(
      gate_up_.get<__nv_bfloat16>(), Tn, config_.intermediate_size, nullptr,
      fp8_->token_codes(fp8, Tn), stream, options_.programmatic_launch);
}

namespace {

// The weight-only GEMVs issue their first weight loads before the PDL wait (Llama-3-8B batch 1
// on an H200: 3.226 -> 3.126 ms a step, kernels/fp8/BENCHMARKS.md); TANDEM_FP8_W16_EARLY=0 after
// it (A/B runs of decode_step_bench).
bool W16EarlyLoads() {
  const char* v = std::getenv("TANDEM_FP8_W16_EARLY");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The weight-only GEMVs' inner loop (kernels/fp8/fp8_w8a16_gemv_cuda.h's Fp8W16Math): kAutoWaves
// (kTensorCoreWide for scales constant along k, the RoPE fold's qkv GEMV included: Llama-3-8B FP8
// batch 1 on an H200 2.80-2.83 -> 2.59-2.62 ms a step, 70B 19.99 -> 18.63; grouped scales: kAuto's
// choice, on kTensorCoreDeep where it fills the SMs' waves better, 8B 3.02-3.05 -> 2.75 ms when it
// came, kernels/fp8/BENCHMARKS.md); TANDEM_FP8_W16_MMA=auto kAuto (3.091 -> 3.026 ms against
// kFp32Fma when it came), =1 kTensorCore everywhere, =0 kFp32Fma, =ring / ring2 / ringhalf the
// shared-memory ring forms (kRing / kRing2 / kRingHalf: kTensorCore's bits, slower), =deep / splitk
// the latency forms (kTensorCoreDeep / kTensorCoreSplitK, S picked per shape; =splitk2 / splitk4: S
// forced), =persistent kTensorCorePersistent (the deep tiles on a persistent grid, the activations
// staged once a CTA), =wide kTensorCoreWide (128 bytes a row a warp load); all also for
// CudaFp8Linear's W8A16 GEMV (PrepareW16Latency) (A/B runs of decode_step_bench).
kernels::cuda::Fp8W16Math W16Math() {
  using kernels::cuda::Fp8W16Math;
  const char* v = std::getenv("TANDEM_FP8_W16_MMA");
  if (v == nullptr || std::strcmp(v, "waves") == 0) return Fp8W16Math::kAutoWaves;
  if (std::strcmp(v, "auto") == 0) return Fp8W16Math::kAuto;
  if (std::strcmp(v, "deep") == 0) return Fp8W16Math::kTensorCoreDeep;
  if (std::strcmp(v, "persistent") == 0) return Fp8W16Math::kTensorCorePersistent;
  if (std::strcmp(v, "wide") == 0) return Fp8W16Math::kTensorCoreWide;
  if (std::strncmp(v, "splitk", 6) == 0) return Fp8W16Math::kTensorCoreSplitK;
  if (std::strcmp(v, "ring") == 0) return Fp8W16Math::kRing;
  if (std::strcmp(v, "ring2") == 0) return Fp8W16Math::kRing2;
  if (std::strcmp(v, "ringhalf") == 0) return Fp8W16Math::kRingHalf;
  return std::strcmp(v, "0") != 0 ? Fp8W16Math::kTensorCore : Fp8W16Math::kFp32Fma;
}

absl::Status PrepareW16Latency(CudaFp8Linear* fp8, int64_t weight_rows) {
  using kernels::cuda::Fp8W16Math;
  const Fp8W16Math math = W16Math();
  if (fp8 == nullptr ||
      (math != Fp8W16Math::kTensorCoreDeep && math != Fp8W16Math::kTensorCoreSplitK &&
       math != Fp8W16Math::kAutoWaves && math != Fp8W16Math::kTensorCorePersistent &&
       math != Fp8W16Math::kTensorCoreWide)) {
    return absl::OkStatus();
  }
  fp8->set_w8a16_math(math);
  if (math != Fp8W16Math::kTensorCoreSplitK) return absl::OkStatus();
  const char* v = std::getenv("TANDEM_FP8_W16_MMA");  // splitk, splitk2, splitk4
  return fp8->ReserveW16SplitK(weight_rows, std::atoi(v + 6));
}

// The RoPE fold (Fp8W16GemvNormInRopeKv) has the kTensorCore inner loop and its wide mapping
// (kTensorCoreWide; kAutoWaves: wide for scales constant along k): under the other latency
// forms the qkv GEMV keeps kTensorCore (kAuto) rather than falling back to the unfused pair.
kernels::cuda::Fp8W16Math W16RopeMath(kernels::cuda::Fp8W16Math math) {
  using kernels::cuda::Fp8W16Math;
  return math == Fp8W16Math::kTensorCoreDeep || math == Fp8W16Math::kTensorCoreSplitK ||
                 math == Fp8W16Math::kTensorCorePersistent
             ? Fp8W16Math::kAuto
             : math;
}

// RoPE + the KV write in the weight-only qkv GEMV's epilogue (Fp8W16GemvNormInRopeKv: the
// separate RopeQkvToCache kernel dropped, q / k / v bit for bit the same); TANDEM_FP8_W16_ROPE=0
// keeps the separate kernel (A/B runs of decode_step_bench).
bool W16FoldsRope() {
  const char* v = std::getenv("TANDEM_FP8_W16_ROPE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The most tokens a step folds on the weight-only GEMVs (2-8 tokens: the multi-token form, one
// weight read for them all), TANDEM_FP8_W16_TOKENS: unset, empty or "auto" (the default), up to
// kFp8W16TokensMaxM where every projection's kernel keeps two CTAs an SM
// (Fp8W16TokensTwoCtasPerSm: Llama-3-8B at 2-3 tokens, 70B at none), returned negated; 1, batch
// 1 only (every larger step on the W8A8 path); N, up to N wherever the kernel fits. On an H200
// "auto" makes Llama-3-8B FP8's batch-2 decode step 5-6% faster and serves concurrency 2 with
// 4-5% more tokens a second at a lower ITL p99 (kernels/fp8/BENCHMARKS.md, thirty-fifth session:
// the p99 rise one earlier session saw did not come back in seven runs, step traces beside).
int64_t W16MaxTokens() {
  const char* v = std::getenv("TANDEM_FP8_W16_TOKENS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) {
    return -kernels::cuda::kFp8W16TokensMaxM;
  }
  return std::clamp<int64_t>(std::atoll(v), 1, kernels::cuda::kFp8W16TokensMaxM);
}

}  // namespace

bool CudaLlamaModel::FoldsFp8(int64_t Tn) const {
  namespace kc = ::tandem::kernels::cuda;
  const int64_t bound = W16MaxTokens();
  if (!options_.fp8_weight_only_fold || options_.dtype != ActDtype::kBf16 || Tn < 1 ||
      Tn > std::abs(bound)) {
    return false;
  }
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t o_k = config_.num_attention_heads * config_.head_dim;
  if (bound < 0 && Tn > 1 &&                             // the two-CTA rule
      !(kc::Fp8W16TokensTwoCtasPerSm(Tn, H, true, 2) &&  // qkv / gate_up: NormIn, R <= 2
        kc::Fp8W16TokensTwoCtasPerSm(Tn, o_k, false, 1) &&
        kc::Fp8W16TokensTwoCtasPerSm(Tn, I, false, 1))) {
    return false;
  }
  for (const Layer& w : layers_) {
    if (w.qkv_fp8.empty() || w.o_fp8.empty() || w.gate_up_fp8.empty() || w.down_fp8.empty() ||
        w.gate_up_fp8.grid.rows != 2 * config_.intermediate_size ||
        !kc::Fp8W16GemvNormInSupported(residual_.data(), w.input_layernorm.data(),
                                       w.qkv_fp8.device(), Tn) ||
        !kc::Fp8W16GemvSupported(attn_.data(), w.o_fp8.device(), Tn) ||
        !kc::Fp8W16GemvNormInSupported(residual_.data(), w.post_attention_layernorm.data(),
                                       w.gate_up_fp8.device(), Tn) ||
        !kc::Fp8W16GemvSupported(act_.data(), w.down_fp8.device(), Tn)) {
      return false;
    }
  }
  return true;
}

// As FoldedLayer: qkv (input norm in its prologue; RoPE + the KV write in its epilogue where
// W16FoldsRope, the KV pool holds bf16 or FP8 codes of one scale per tensor, no qk-norm and
// Fp8W16GemvNormInRopeKvSupported; else a separate RopeQkvToCache) -> attention -> o_proj (adds
// into residual_) -> gate_up + SiLU*up (post-attention norm in its prologue) -> down_proj (adds
// into residual_), every product W8A16.
absl::Status CudaLlamaModel::FoldedLayerFp8(const DeviceStep& step,
                                            const kernels::cuda::DeviceKvCache& cache, int64_t l,
                                            const StepAttentionPlan& plan, void* attn_workspace,
                                            cudaStream_t stream) {
  namespace kc = ::tandem::kernels::cuda;
  using bf16 = __nv_bfloat16;
  const int64_t Tn = step.num_tokens;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool pdl = options_.programmatic_launch, early = W16EarlyLoads();
  const kc::Fp8W16Math math = W16Math();
  const kc::Fp8W16SplitKWorkspace* split_k = fp8_ != nullptr ? fp8_->w16_split_k() : nullptr;
  const Layer& w = layers_[l];
  bf16* residual = residual_.get<bf16>();
  const kc::GemvRopeKv rope = RopeKvArgs(step, cache, l, q_.get<bf16>());
  const bf16* o_in;
  const bool pool_ok = cache.dtype == kc::KvDtype::kBf16 ||
                       (cache.dtype == kc::KvDtype::kFp8E4m3 && !cache.per_head_scale);
  if (W16FoldsRope() && !config_.qk_norm && pool_ok &&
      kc::Fp8W16GemvNormInRopeKvSupported(residual, w.input_layernorm.data(), w.qkv_fp8.device(),
                                          Tn, rope, W16RopeMath(math))) {  // q_, pool; not qkv_
    RETURN_IF_ERROR(kc::Fp8W16GemvNormInRopeKv(residual, w.input_layernorm.get<bf16>(), eps,
                                               w.qkv_fp8.device(), w.qkv_bias.get<bf16>(), Tn, rope,
                                               stream, pdl, early, W16RopeMath(math)));
    ASSIGN_OR_RETURN(o_in, Attention<bf16>(step, cache, l, plan, attn_workspace, stream));
  } else {
    RETURN_IF_ERROR(kc::Fp8W16GemvNormIn(residual, w.input_layernorm.get<bf16>(), eps,
                                         w.qkv_fp8.device(), w.qkv_bias.get<bf16>(), Tn,
                                         qkv_.get<bf16>(), stream, pdl, early, math, split_k));
    ASSIGN_OR_RETURN(o_in, AttendFromQkv<bf16>(step, cache, l, plan, attn_workspace, stream));
  }
  RETURN_IF_ERROR(kc::Fp8W16GemvAddTo(o_in, w.o_fp8.device(), w.o_bias.get<bf16>(), Tn, residual,
                                      stream, pdl, early, math, split_k));
  RETURN_IF_ERROR(kc::Fp8W16GemvNormInSiluMul(
      residual, w.post_attention_layernorm.get<bf16>(), eps, w.gate_up_fp8.device(),
      w.gate_up_bias.get<bf16>(), Tn, act_.get<bf16>(), stream, pdl, early, math, split_k));
  return kc::Fp8W16GemvAddTo(act_.get<bf16>(), w.down_fp8.device(), w.down_bias.get<bf16>(), Tn,
                             residual, stream, pdl, early, math, split_k);
}

absl::Status CudaLlamaModel::LmHeadFp8(int64_t R, float* out, cudaStream_t stream) {
  namespace kc = ::tandem::kernels::cuda;
  using bf16 = __nv_bfloat16;
  if (options_.dtype != ActDtype::kBf16 || fp8_ == nullptr) {
    return absl::FailedPreconditionError("an FP8 lm_head needs bf16 activations");
  }
  const bool pdl = options_.programmatic_launch;
  const bf16* last = last_.get<bf16>();
  const kc::Fp8DeviceWeight w = lm_head_fp8_.device();
  if (R == 1 && options_.fp8_weight_only_fold && kc::Fp8W16GemvSupported(last, w, R)) {
    return kc::Fp8W16Gemv<float>(last, w, nullptr, R, out, stream, pdl, W16EarlyLoads(), W16Math(),
                                 fp8_->w16_split_k());
  }
  bf16* out16 = lm_head_out_.get<bf16>();
  RETURN_IF_ERROR(fp8_->Linear(last, lm_head_fp8_, nullptr, R, out16, stream, pdl));
  return kc::ConvertToF32<bf16>(out16, R * w.grid.rows, out, stream);
}

}  // namespace tandem::runtime::cuda
