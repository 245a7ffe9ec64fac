#include "runtime/cuda/cuda_moe_mlp.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/convert_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_ep_cuda.h"
#include "runtime/cuda/dummy_init.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// Sizes (elements) of the layer's tensors for `c` (the rank's config).
struct MoeShapes {
  int64_t router, experts_gate_up, experts_down, shared_gate_up, shared_down, shared_gate, bias;
};
// Experts in the device buffers: all of them, or under expert parallelism the rank's plus one
// all-zero expert that the rows of other ranks' experts go to (kernels/moe/moe_ep_cuda.h).
int64_t DeviceExperts(const ModelConfig& c) {
  return c.expert_placement == nullptr ? c.num_experts : c.NumHeldExperts() + 1;
}

MoeShapes ShapesOf(const ModelConfig& c) {
  const int64_t E = c.num_experts, H = c.hidden_size, Ie = c.moe_intermediate_size,
                Is = c.shared_expert_intermediate_size, Ed = DeviceExperts(c);
  const bool gated = Is > 0 && !c.DeepseekMoe();
  const bool bias = c.moe_router == ModelConfig::MoeRouter::kDeepseekV3;
  return {E * H, Ed * 2 * Ie * H, Ed * H * Ie, 2 * Is * H, H * Is, gated ? H : 0, bias ? E : 0};
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(std::vector<float>* host, int64_t want, const std::string& name,
                                    DeviceBuffer* staging, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(host->size());
  if (n != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", name, " has ", n, " elements, expected ", want));
  }
  if (n == 0) return DeviceBuffer();
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  if (staging->bytes() < bytes) {
    staging->Reset();
    ASSIGN_OR_RETURN(*staging, DeviceBuffer::Allocate(bytes, "moe staging"));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging->data(), host->data(), bytes, cudaMemcpyHostToDevice, stream));
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(n * sizeof(T), name.c_str()));
  if constexpr (std::is_same_v<T, float>) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.data(), staging->data(), bytes, cudaMemcpyDeviceToDevice, stream));
  } else {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging->get<float>(), n, out.get<T>(), stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // staging reused next
  std::vector<float>().swap(*host);
  return out;
}

// out = a . w^T on the batch-1 GEMV where it applies, else cuBLASLt.
template <typename T, typename TOut>
absl::Status Lin(kc::CublasLtGemm& gemm, const T* a, const T* w, int64_t m, int64_t n, int64_t k,
                 TOut* out, cudaStream_t stream, bool pdl = false) {
  if (m == 1 && kc::SmallMLinearSupported(a, w, m, n, k)) {
    return kc::SmallMLinear<T, TOut>(a, w, nullptr, m, n, k, out, stream, pdl);
  }
  return gemm.Linear<T, TOut>(a, w, nullptr, m, n, k, out, stream);
}

}  // namespace

int64_t CudaMoeWeights::bytes() const {
  return router.bytes() + router_bias.bytes() + experts_gate_up.bytes() + experts_down.bytes() +
         shared_gate_up.bytes() + shared_down.bytes() + shared_expert_gate.bytes() +
         (fp8 != nullptr ? fp8->bytes() : 0);
}

template <typename T>
absl::StatusOr<CudaMoeWeights> UploadMoeWeights(const ModelConfig& c, LayerWeights* l,
                                                cudaStream_t stream, int64_t fp8_max_tokens) {
  const MoeShapes s = ShapesOf(c);
  DeviceBuffer staging;
  CudaMoeWeights w;
  ASSIGN_OR_RETURN(w.router, Upload<T>(&l->router, s.router, "router", &staging, stream));
  ASSIGN_OR_RETURN(w.router_bias,
                   Upload<float>(&l->router_bias, s.bias, "router bias", &staging, stream));
  if (!l->experts_gate_up_fp8.empty()) {  // FP8 checkpoints: e4m3 experts (cuda_moe_fp8.h)
    ASSIGN_OR_RETURN(w.fp8, UploadFp8MoeWeights(c, l, fp8_max_tokens));
  } else if (c.expert_placement != nullptr) {  // the rank's experts, then the zero expert
    const int64_t H = c.hidden_size, Ie = c.moe_intermediate_size;
    if (static_cast<int64_t>(l->experts_gate_up.size()) == s.experts_gate_up - 2 * Ie * H &&
        static_cast<int64_t>(l->experts_down.size()) == s.experts_down - H * Ie) {
      l->experts_gate_up.resize(s.experts_gate_up, 0.0f);
      l->experts_down.resize(s.experts_down, 0.0f);
    }
  }
  if (w.fp8 == nullptr) {
    ASSIGN_OR_RETURN(w.experts_gate_up, Upload<T>(&l->experts_gate_up, s.experts_gate_up,
                                                  "experts gate_up", &staging, stream));
    ASSIGN_OR_RETURN(w.experts_down,
                     Upload<T>(&l->experts_down, s.experts_down, "experts down", &staging, stream));
  }
  if (w.fp8 == nullptr || w.fp8->shared_down.empty()) {
    ASSIGN_OR_RETURN(w.shared_gate_up, Upload<T>(&l->shared_gate_up, s.shared_gate_up,
                                                 "shared expert gate_up", &staging, stream));
    ASSIGN_OR_RETURN(w.shared_down, Upload<T>(&l->shared_down, s.shared_down, "shared expert down",
                                              &staging, stream));
  }
  ASSIGN_OR_RETURN(w.shared_expert_gate, Upload<T>(&l->shared_expert_gate, s.shared_gate,
                                                   "shared_expert_gate", &staging, stream));
  return w;
}

absl::StatusOr<CudaMoeWeights> AllocateMoeWeights(const ModelConfig& c, cudaStream_t stream,
                                                  int64_t fp8_max_tokens) {
  MoeShapes s = ShapesOf(c);
  CudaMoeWeights w;
  if (c.quantization.IsFp8()) {  // e4m3 experts and shared experts (cuda_moe_fp8.h)
    ASSIGN_OR_RETURN(w.fp8, AllocateFp8MoeWeights(c, fp8_max_tokens));
    s.experts_gate_up = s.experts_down = s.shared_gate_up = s.shared_down = 0;
  }
  auto alloc = [&](DeviceBuffer* b, int64_t n, int64_t es, const char* what) -> absl::Status {
    ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(n * es, what));
    if (n > 0) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->data(), 0, b->bytes(), stream));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(alloc(&w.router, s.router, 2, "router"));
  RETURN_IF_ERROR(alloc(&w.router_bias, s.bias, 4, "router bias"));
  RETURN_IF_ERROR(alloc(&w.experts_gate_up, s.experts_gate_up, 2, "experts gate_up"));
  RETURN_IF_ERROR(alloc(&w.experts_down, s.experts_down, 2, "experts down"));
  RETURN_IF_ERROR(alloc(&w.shared_gate_up, s.shared_gate_up, 2, "shared gate_up"));
  RETURN_IF_ERROR(alloc(&w.shared_down, s.shared_down, 2, "shared down"));
  RETURN_IF_ERROR(alloc(&w.shared_expert_gate, s.shared_gate, 2, "shared_expert_gate"));
  return w;
}

bool IsMoeSlot(WeightSlot slot) {
  switch (slot) {
    case WeightSlot::kRouter:
    case WeightSlot::kExpertsGateUp:
    case WeightSlot::kExpertsDown:
    case WeightSlot::kSharedGateUp:
    case WeightSlot::kSharedDown:
    case WeightSlot::kSharedExpertGate:
    case WeightSlot::kRouterBias:
      return true;
    default:
      return false;
  }
}

template <typename T>
absl::Status FillMoeDummy(const DummyTensorFill& f, uint64_t seed, CudaMoeWeights* w,
                          DeviceBuffer* fp8_staging, cudaStream_t stream) {
  if (w->fp8 != nullptr &&
      (f.slot == WeightSlot::kExpertsGateUp || f.slot == WeightSlot::kExpertsDown ||
       f.slot == WeightSlot::kSharedGateUp || f.slot == WeightSlot::kSharedDown)) {
    return FillFp8MoeDummy(f, seed, fp8_staging, w->fp8.get(), stream);
  }
  DeviceBuffer* b = nullptr;
  switch (f.slot) {
    case WeightSlot::kRouter:
      b = &w->router;
      break;
    case WeightSlot::kExpertsGateUp:
      b = &w->experts_gate_up;
      break;
    case WeightSlot::kExpertsDown:
      b = &w->experts_down;
      break;
    case WeightSlot::kSharedGateUp:
      b = &w->shared_gate_up;
      break;
    case WeightSlot::kSharedDown:
      b = &w->shared_down;
      break;
    case WeightSlot::kSharedExpertGate:
      b = &w->shared_expert_gate;
      break;
    case WeightSlot::kRouterBias:
      b = &w->router_bias;
      break;
    default:
      break;
  }
  const bool fp32 = f.slot == WeightSlot::kRouterBias;
  const int64_t es = fp32 ? 4 : 2;
  if (b == nullptr || (f.offset + f.slice.numel()) * es > b->bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dummy plan does not fit the MoE layer: slot ", static_cast<int>(f.slot), " layer ",
        f.layer, " elements [", f.offset, ", ", f.offset + f.slice.numel(), ")"));
  }
  if (fp32) {
    return FillDummySlice(b->get<float>() + f.offset, f.slice, f.mean, seed, f.stream_id, stream);
  }
  return FillDummySlice(b->get<T>() + f.offset, f.slice, f.mean, seed, f.stream_id, stream);
}

absl::StatusOr<CudaMoeKernels> CudaMoeKernels::FromEnv() {
  CudaMoeKernels k;
  const char* env = std::getenv("TANDEM_MOE_KERNELS");
  if (env == nullptr) return k;
  // A list names exactly what is on.
  k.split_combine = k.mma_grouped = k.wgmma_grouped = k.fused_glu = false;
  for (absl::string_view item : absl::StrSplit(env, ',', absl::SkipEmpty())) {
    if (item == "new") {
      k.split_combine = k.mma_grouped = k.fused_route = k.pdl = k.wgmma_grouped = k.fused_glu =
          true;
    } else if (item == "split_combine") {
      k.split_combine = true;
    } else if (item == "mma_grouped") {
      k.mma_grouped = true;
    } else if (item == "fused_route") {
      k.fused_route = true;
    } else if (item == "pdl") {
      k.pdl = true;
    } else if (item == "wgmma_grouped") {
      k.wgmma_grouped = true;
    } else if (item == "fused_glu") {
      k.fused_glu = true;
    } else if (item != "old") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_MOE_KERNELS: unknown '", item,
                       "' (a comma-separated subset of split_combine, mma_grouped, fused_route, "
                       "pdl, wgmma_grouped, fused_glu; new; old)"));
    }
  }
  return k;
}

CudaMoeMlp::CudaMoeMlp(const ModelConfig& config, int64_t max_tokens)
    : config_(config), max_tokens_(max_tokens) {}

absl::StatusOr<std::unique_ptr<CudaMoeMlp>> CudaMoeMlp::Create(const ModelConfig& c,
                                                               int64_t max_tokens) {
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size;
  const int64_t Ie = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  if (E < 1 || E > kernels::cuda::kMoeMaxExperts || k < 1 || k > E || max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA MoE layer takes 1..", kernels::cuda::kMoeMaxExperts, " experts and 1 <= ",
        "num_experts_per_tok <= num_experts (got ", E, " experts, ", k, " per token)"));
  }
  std::unique_ptr<CudaMoeMlp> m(new CudaMoeMlp(c, max_tokens));
  const int64_t Ed = m->experts_ = DeviceExperts(c);
  kernels::GroupedRoutingParams& p = m->routing_;
  const bool v3 = c.moe_router == ModelConfig::MoeRouter::kDeepseekV3;
  p.num_experts = E;
  p.top_k = k;
  p.renormalize = c.norm_topk_prob;
  if (c.DeepseekMoe()) {
    p.scoring = v3 ? kernels::MoeScoring::kSigmoid : kernels::MoeScoring::kSoftmax;
    p.num_groups = c.num_expert_groups;
    p.topk_groups = c.topk_expert_groups;
    p.group_score = v3 ? kernels::MoeGroupScore::kTopTwoSum : kernels::MoeGroupScore::kMax;
    p.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  }
  ASSIGN_OR_RETURN(m->kernels_, CudaMoeKernels::FromEnv());
  if (m->kernels_.mma_grouped) RETURN_IF_ERROR(kernels::cuda::MoeGroupedMmaInit());
  if (m->kernels_.wgmma_grouped) RETURN_IF_ERROR(kernels::cuda::MoeGroupedWgmmaInit());
  ASSIGN_OR_RETURN(m->grouped_, kernels::cuda::MoeGroupedGemm::Create(Ed));
  if (c.quantization.IsFp8()) {  // FP8 experts (cuda_moe_fp8.h)
    ASSIGN_OR_RETURN(m->fp8_, CudaFp8MoeExperts::Create(c, max_tokens));
  }
  const int64_t T = max_tokens, rows = T * k;
  auto alloc = [](DeviceBuffer* b, int64_t bytes, const char* what) -> absl::Status {
    ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(bytes, what));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(alloc(&m->logits_, T * E * 4, "moe router logits"));
  RETURN_IF_ERROR(alloc(&m->ids_, rows * 4, "moe expert ids"));
  RETURN_IF_ERROR(alloc(&m->weights_, rows * 4, "moe weights"));
  RETURN_IF_ERROR(alloc(&m->offsets_, (Ed + 1) * 4, "moe expert offsets"));
  RETURN_IF_ERROR(alloc(&m->active_, Ed * 4, "moe active experts"));
  RETURN_IF_ERROR(alloc(&m->token_of_row_, rows * 4, "moe token of row"));
  RETURN_IF_ERROR(alloc(&m->row_of_pair_, rows * 4, "moe row of pair"));
  RETURN_IF_ERROR(alloc(&m->padded_row_of_pair_, rows * 4, "moe padded row of pair"));
  // Rows of the experts' buffers: the permuted batch (grouped path), or E x cap padded rows.
  const int64_t padded = Ed * std::min(T, kSyncFreeMaxTokens);
  const int64_t most = std::max(padded, T > kSyncFreeMaxTokens ? rows : 0);
  RETURN_IF_ERROR(alloc(&m->rows_in_, most * H * 2, "moe gathered rows"));
  RETURN_IF_ERROR(alloc(&m->gate_up_, most * 2 * Ie * 2, "moe gate_up"));
  RETURN_IF_ERROR(alloc(&m->act_, std::max(most, rows) * Ie * 2, "moe act"));
  RETURN_IF_ERROR(alloc(&m->expert_out_, std::max(most, rows) * H * 2, "moe expert out"));
  RETURN_IF_ERROR(alloc(&m->shared_gate_up_, T * 2 * Is * 2, "shared gate_up"));
  RETURN_IF_ERROR(alloc(&m->shared_act_, T * Is * 2, "shared act"));
  RETURN_IF_ERROR(alloc(&m->shared_out_, T * H * 2, "shared out"));
  RETURN_IF_ERROR(alloc(&m->load_, c.num_hidden_layers * E * 8, "moe expert load"));
  CUDA_RETURN_IF_ERROR(cudaMemset(m->load_.data(), 0, m->load_.bytes()));
  if (c.expert_placement != nullptr) {  // expert parallelism: global id -> local slot or -1
    const std::vector<int32_t> slots = c.expert_placement->LocalSlots(c.expert_rank);
    RETURN_IF_ERROR(alloc(&m->slot_of_expert_, E * 4, "moe expert slots"));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(m->slot_of_expert_.data(), slots.data(), E * 4, cudaMemcpyHostToDevice));
  }
  return m;
}

absl::StatusOr<std::vector<int64_t>> CudaMoeMlp::ExpertLoad() const {
  std::vector<int64_t> out(config_.num_hidden_layers * config_.num_experts);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out.data(), load_.data(), out.size() * 8, cudaMemcpyDeviceToHost));
  return out;
}

// The experts on MoeGroupedMma, or for prefill-sized steps on sm_90 MoeGroupedWgmma (the same
// contract on Hopper's warpgroup MMA), gate_up there with SiLU * up in its epilogue
// (CudaMoeKernels::fused_glu; bit-identical to gate_up + MoeSiluAndMul).
template <typename T>
absl::Status CudaMoeMlp::GroupedMma(const CudaMoeWeights& w, const T* x, int64_t Tn,
                                    cudaStream_t stream) {
  const int64_t E = experts_, H = config_.hidden_size, I = config_.moe_intermediate_size,
                rows = Tn * config_.num_experts_per_tok;
  const bool wgmma = kernels_.wgmma_grouped && Tn >= kWgmmaMinTokens &&
                     kc::MoeGroupedWgmmaSupported(x, w.experts_gate_up.data(), 2 * I, H) &&
                     kc::MoeGroupedWgmmaSupported(act_.data(), w.experts_down.data(), H, I);
  const auto grouped = wgmma ? kc::MoeGroupedWgmma<T> : kc::MoeGroupedMma<T>;
  if (wgmma && kernels_.fused_glu && I % 8 == 0) {
    RETURN_IF_ERROR(kc::MoeGroupedWgmmaGateUpSilu<T>(
        x, token_of_row_.get<int32_t>(), w.experts_gate_up.get<T>(), offsets_.get<int32_t>(), E,
        rows, I, H, act_.get<T>(), stream));
    ++fused_glu_steps_;
  } else {
    RETURN_IF_ERROR(grouped(x, token_of_row_.get<int32_t>(), w.experts_gate_up.get<T>(),
                            offsets_.get<int32_t>(), E, rows, 2 * I, H, gate_up_.get<T>(), stream));
    RETURN_IF_ERROR(kc::MoeSiluAndMul<T>(gate_up_.get<T>(), rows, I, act_.get<T>(), stream));
  }
  return grouped(act_.get<T>(), nullptr, w.experts_down.get<T>(), offsets_.get<int32_t>(), E, rows,
                 H, I, expert_out_.get<T>(), stream);
}

template <typename T>
absl::Status CudaMoeMlp::Experts(const CudaMoeWeights& w, const T* x, int64_t Tn,
                                 const int32_t** row_map, cudaStream_t stream) {
  const int64_t E = experts_, H = config_.hidden_size, I = config_.moe_intermediate_size,
                k = config_.num_experts_per_tok, rows = Tn * k;
  const kc::DeviceMoePermutation perm{offsets_.get<int32_t>(), active_.get<int32_t>(),
                                      token_of_row_.get<int32_t>(), row_of_pair_.get<int32_t>()};
  const auto dt = std::is_same_v<T, __half> ? kc::MoeGroupedGemm::Dtype::kFp16
                                            : kc::MoeGroupedGemm::Dtype::kBf16;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  Path path = path_;
  if (path == Path::kAuto || (path == Path::kGrouped && capture != cudaStreamCaptureStatusNone)) {
    path = Tn <= std::max<int64_t>(4, E / k) ? Path::kGemv
           : Tn <= kSyncFreeMaxTokens        ? Path::kPadded
                                             : Path::kGrouped;
  }
  *row_map = row_of_pair_.get<int32_t>();
  if (w.fp8 != nullptr) {  // FP8 experts: GEMVs, or one FP8 GEMM per expert (cuda_moe_fp8.h)
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (fp8_ == nullptr) return absl::FailedPreconditionError("FP8 experts, no FP8 scratch");
      return fp8_->Routed(*w.fp8, x, Tn, perm, E, rows_in_.get<T>(), gate_up_.get<T>(),
                          act_.get<T>(), expert_out_.get<T>(),
                          capture == cudaStreamCaptureStatusNone ? grouped_.get() : nullptr, stream,
                          kernels_.pdl);
    }
    return absl::InvalidArgumentError("FP8 experts need bf16 activations");
  }
  if (path == Path::kGemv) {
    RETURN_IF_ERROR(kc::MoeExpertGemvGateUp<T>(x, w.experts_gate_up.get<T>(), H, I, perm, E, rows,
                                               act_.get<T>(), stream, kernels_.pdl));
    return kc::MoeExpertGemvDown<T>(act_.get<T>(), w.experts_down.get<T>(), H, I, perm, E, rows,
                                    expert_out_.get<T>(), stream, kernels_.pdl);
  }
  // MoeGroupedMma (TANDEM_MOE_KERNELS=mma_grouped): sync-free, so it replaces both the padded
  // and the grouped path (unless set_path asked for kPadded), under capture too. Many small
  // experts only: Mixtral-sized ones keep cuBLAS.
  if (path != Path::kGemv && path_ != Path::kPadded && kernels_.mma_grouped && E > 16 &&
      gate_up_.bytes() >= rows * 2 * I * 2 && act_.bytes() >= rows * I * 2 &&
      expert_out_.bytes() >= rows * H * 2 &&
      kc::MoeGroupedMmaSupported(x, w.experts_gate_up.data(), 2 * I, H) &&
      kc::MoeGroupedMmaSupported(act_.data(), w.experts_down.data(), H, I)) {
    return GroupedMma<T>(w, x, Tn, stream);
  }
  if (path == Path::kPadded) {  // cap = T: no expert gets more rows than there are tokens
    if (Tn > kSyncFreeMaxTokens) {
      return absl::InvalidArgumentError(absl::StrCat("moe: padded path for ", Tn, " tokens"));
    }
    RETURN_IF_ERROR(kc::MoePadRows<T>(x, H, ids_.get<int32_t>(), perm, E, rows, Tn,
                                      rows_in_.get<T>(), padded_row_of_pair_.get<int32_t>(),
                                      stream));
    RETURN_IF_ERROR(grouped_->RunPadded(rows_in_.data(), w.experts_gate_up.data(), E, Tn, 2 * I, H,
                                        gate_up_.data(), dt, stream));
    RETURN_IF_ERROR(kc::MoeSiluAndMul<T>(gate_up_.get<T>(), E * Tn, I, act_.get<T>(), stream));
    RETURN_IF_ERROR(grouped_->RunPadded(act_.data(), w.experts_down.data(), E, Tn, H, I,
                                        expert_out_.data(), dt, stream));
    *row_map = padded_row_of_pair_.get<int32_t>();
    return absl::OkStatus();
  }
  if (rows_in_.bytes() < rows * H * 2 || gate_up_.bytes() < rows * 2 * I * 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe: ", Tn, " tokens on the grouped path, scratch sized for ", max_tokens_));
  }
  // Few large experts (Mixtral): one cublasGemmEx each beat the grouped call on the H200
  // (kernels/moe/BENCHMARKS.md).
  const auto mode =
      E <= 16 ? kc::MoeGroupedGemm::Mode::kPerExpert : kc::MoeGroupedGemm::Mode::kGrouped;
  RETURN_IF_ERROR(
      kc::MoeGatherRows<T>(x, H, token_of_row_.get<int32_t>(), rows, rows_in_.get<T>(), stream));
  RETURN_IF_ERROR(grouped_->ReadOffsets(offsets_.get<int32_t>(), E, stream));
  RETURN_IF_ERROR(grouped_->Run(rows_in_.data(), w.experts_gate_up.data(), 2 * I, H,
                                gate_up_.data(), dt, 0, mode, stream));
  RETURN_IF_ERROR(kc::MoeSiluAndMul<T>(gate_up_.get<T>(), rows, I, act_.get<T>(), stream));
  return grouped_->Run(act_.data(), w.experts_down.data(), H, I, expert_out_.data(), dt, 1, mode,
                       stream);
}

template <typename T>
absl::Status CudaMoeMlp::SharedExpert(const CudaMoeWeights& w, const T* x, int64_t Tn,
                                      kc::CublasLtGemm& gemm, cudaStream_t stream) {
  const int64_t H = config_.hidden_size, Is = config_.shared_expert_intermediate_size;
  if (w.fp8 != nullptr && !w.fp8->shared_down.empty()) {  // e4m3 shared experts (DeepSeek)
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (fp8_ == nullptr) return absl::FailedPreconditionError("FP8 experts, no FP8 scratch");
      return fp8_->Shared(*w.fp8, x, Tn, shared_gate_up_.get<T>(), shared_act_.get<T>(),
                          shared_out_.get<T>(), stream);
    }
    return absl::InvalidArgumentError("FP8 shared experts need bf16 activations");
  }
  const T* gate_up = w.shared_gate_up.get<T>();
  if (Is % 8 != 0 || H % 8 != 0) {  // widths cuBLASLt may refuse (small TP slices): cuBLAS
    const auto dt = std::is_same_v<T, __half> ? kc::MoeGroupedGemm::Dtype::kFp16
                                              : kc::MoeGroupedGemm::Dtype::kBf16;
    RETURN_IF_ERROR(grouped_->Dense(x, gate_up, Tn, 2 * Is, H, shared_gate_up_.data(), dt, stream));
    RETURN_IF_ERROR(
        kc::MoeSiluAndMul<T>(shared_gate_up_.get<T>(), Tn, Is, shared_act_.get<T>(), stream));
    return grouped_->Dense(shared_act_.data(), w.shared_down.data(), Tn, H, Is, shared_out_.data(),
                           dt, stream);
  }
  // One token: both GEMVs PDL-launched as the routed experts' (kernels_.pdl): each waits for its
  // predecessor before reading, so it only gains that predecessor's tail and its own launch.
  const bool pdl = kernels_.pdl;
  if (Tn == 1 && kc::SmallMLinearSupported(x, gate_up, 1, 2 * Is, H)) {
    RETURN_IF_ERROR(kc::SmallMLinearSiluMul<T>(x, gate_up, nullptr, 1, Is, H, shared_act_.get<T>(),
                                               stream, pdl));
  } else {
    RETURN_IF_ERROR((Lin<T, T>(gemm, x, gate_up, Tn, 2 * Is, H, shared_gate_up_.get<T>(), stream)));
    RETURN_IF_ERROR(
        kc::SiluAndMul<T>(shared_gate_up_.get<T>(), Tn, Is, shared_act_.get<T>(), stream));
  }
  return Lin<T, T>(gemm, shared_act_.get<T>(), w.shared_down.get<T>(), Tn, H, Is,
                   shared_out_.get<T>(), stream, pdl);
}

template <typename T>
absl::Status CudaMoeMlp::Forward(const CudaMoeWeights& w, const T* x, int64_t Tn, int64_t layer,
                                 T* out, kc::CublasLtGemm& gemm, cudaStream_t stream,
                                 bool add_to_out) {
  if (all_to_all_ != nullptr) {
    if (add_to_out) return absl::UnimplementedError("moe add_to_out under the all-to-all");
    return ForwardDispatched<T>(w, x, Tn, layer, out, gemm, stream);
  }
  const int64_t E = config_.num_experts, k = config_.num_experts_per_tok, H = config_.hidden_size;
  if (Tn < 1 || Tn > max_tokens_ || layer < 0 || layer >= config_.num_hidden_layers ||
      w.router.bytes() != E * H * 2 || (w.experts_down.empty() && w.fp8 == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("moe layer ", layer, ": ", Tn,
                                                   " tokens (at most ", max_tokens_,
                                                   ") or weights not of this config"));
  }
  kernels::GroupedRoutingParams p = routing_;
  p.correction_bias = w.router_bias.empty() ? nullptr : w.router_bias.get<float>();
  // The router sees the whole (replicated) hidden state on every rank: all ranks route alike.
  const bool pdl = kernels_.pdl;
  RETURN_IF_ERROR(
      (Lin<T, float>(gemm, x, w.router.get<T>(), Tn, E, H, logits_.get<float>(), stream, pdl)));
  int64_t* load = load_.get<int64_t>() + layer * E;  // global ids
  const kc::DeviceMoePermutation perm{offsets_.get<int32_t>(), active_.get<int32_t>(),
                                      token_of_row_.get<int32_t>(), row_of_pair_.get<int32_t>()};
  if (kernels_.fused_route && config_.expert_placement == nullptr && Tn <= kFusedRouteMaxTokens &&
      kc::MoeRouteAndPermuteSupported(p, Tn)) {
    RETURN_IF_ERROR(kc::MoeRouteAndPermute(logits_.get<float>(), Tn, p, ids_.get<int32_t>(),
                                           weights_.get<float>(), perm, load, stream, pdl));
  } else {
    RETURN_IF_ERROR(kc::MoeRoute(logits_.get<float>(), Tn, p, ids_.get<int32_t>(),
                                 weights_.get<float>(), stream));
    if (config_.expert_placement != nullptr) {  // expert parallelism: this rank's rows only
      RETURN_IF_ERROR(kc::MoeLocalizeRouting(ids_.get<int32_t>(), weights_.get<float>(), Tn * k,
                                             slot_of_expert_.get<int32_t>(), E, experts_ - 1, load,
                                             stream));
      load = nullptr;
    }
    RETURN_IF_ERROR(kc::MoePermute(ids_.get<int32_t>(), Tn, k, experts_, perm, load, stream));
  }
  const int32_t* row_map = nullptr;  // where each (token, j)'s expert output row is
  RETURN_IF_ERROR(Experts<T>(w, x, Tn, &row_map, stream));
  const bool shared = w.has_shared();
  if (shared) RETURN_IF_ERROR(SharedExpert<T>(w, x, Tn, gemm, stream));
  const T* shared_out = shared ? shared_out_.get<T>() : nullptr;
  const T* gate = w.shared_expert_gate.empty() ? nullptr : w.shared_expert_gate.get<T>();
  if (add_to_out) {  // out is the residual stream: out += the combine (as FusedAddRmsNorm adds)
    return kc::MoeCombineAddTo<T>(expert_out_.get<T>(), weights_.get<float>(), row_map, Tn, k, H,
                                  shared_out, gate, x, out, kernels_.split_combine, stream, pdl);
  }
  if (kernels_.split_combine) {
    return kc::MoeCombineSplit<T>(expert_out_.get<T>(), weights_.get<float>(), row_map, Tn, k, H,
                                  shared_out, gate, x, out, stream, pdl);
  }
  return kc::MoeCombine<T>(expert_out_.get<T>(), weights_.get<float>(), row_map, Tn, k, H,
                           shared_out, gate, x, out, stream);
}

#define TANDEM_CUDA_MOE_MLP_INSTANTIATE(T)                                                        \
  template absl::StatusOr<CudaMoeWeights> UploadMoeWeights<T>(const ModelConfig&, LayerWeights*,  \
                                                              cudaStream_t, int64_t);             \
  template absl::Status FillMoeDummy<T>(const DummyTensorFill&, uint64_t, CudaMoeWeights*,        \
                                        DeviceBuffer*, cudaStream_t);                             \
  template absl::Status CudaMoeMlp::Forward<T>(const CudaMoeWeights&, const T*, int64_t, int64_t, \
                                               T*, kc::CublasLtGemm&, cudaStream_t, bool);        \
  /* for ForwardDispatched (cuda_moe_mlp_dispatch.cc) */                                          \
  template absl::Status CudaMoeMlp::Experts<T>(const CudaMoeWeights&, const T*, int64_t,          \
                                               const int32_t**, cudaStream_t);                    \
  template absl::Status CudaMoeMlp::SharedExpert<T>(const CudaMoeWeights&, const T*, int64_t,     \
                                                    kc::CublasLtGemm&, cudaStream_t);
TANDEM_CUDA_MOE_MLP_INSTANTIATE(__nv_bfloat16)
TANDEM_CUDA_MOE_MLP_INSTANTIATE(__half)
#undef TANDEM_CUDA_MOE_MLP_INSTANTIATE

}  // namespace tandem::runtime::cuda
