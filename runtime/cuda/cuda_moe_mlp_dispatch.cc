// CudaMoeMlp under data-parallel attention (UseAllToAll; cuda_moe_mlp.h): route this rank's own
// tokens, shared expert locally, rows to their experts' ranks and back (cuda_moe_all_to_all.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/moe/moe_cuda.h"
#include "runtime/cuda/cuda_moe_mlp.h"

namespace tandem::runtime::cuda {

namespace kc = ::tandem::kernels::cuda;

absl::Status CudaMoeMlp::UseAllToAll(comm::DeviceCommunicator* comm, int64_t rank_max_tokens) {
  if (comm != nullptr && rank_max_tokens * comm->size() > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE all-to-all: the layer's scratch holds ", max_tokens_, " rows, ",
                     comm->size(), " ranks of ", rank_max_tokens, " tokens may send more"));
  }
  ASSIGN_OR_RETURN(all_to_all_, CudaMoeAllToAll::Create(config_, rank_max_tokens, comm));
  return absl::OkStatus();
}

absl::Status CudaMoeMlp::ForwardIdle(const std::function<const CudaMoeWeights&(int64_t)>& weights,
                                     bool bf16, kc::CublasLtGemm& gemm, cudaStream_t stream) {
  if (all_to_all_ == nullptr) {
    return absl::FailedPreconditionError("ForwardIdle: not a data-parallel attention MoE rank");
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    if (bf16) {
      RETURN_IF_ERROR(Forward<__nv_bfloat16>(weights(l), nullptr, 0, l, nullptr, gemm, stream));
    } else {
      RETURN_IF_ERROR(Forward<__half>(weights(l), nullptr, 0, l, nullptr, gemm, stream));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaMoeMlp::ForwardDispatched(const CudaMoeWeights& w, const T* x, int64_t Tn,
                                           int64_t layer, T* out, kc::CublasLtGemm& gemm,
                                           cudaStream_t stream) {
  const int64_t E = config_.num_experts, k = config_.num_experts_per_tok, H = config_.hidden_size;
  if (Tn < 0 || layer < 0 || layer >= config_.num_hidden_layers || w.router.bytes() != E * H * 2 ||
      (w.experts_down.empty() && w.fp8 == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe layer ", layer, ": ", Tn, " tokens or weights not of this config"));
  }
  // FP8 checkpoints: Experts() runs the rank's e4m3 experts (and the zero expert) on the rows
  // received, SharedExpert() the e4m3 shared experts on the rank's own tokens.
  const bool shared = w.has_shared();
  if (Tn > 0) {  // the rank's own tokens: global routing, then its shared expert
    kernels::GroupedRoutingParams p = routing_;
    p.correction_bias = w.router_bias.empty() ? nullptr : w.router_bias.get<float>();
    RETURN_IF_ERROR((gemm.Linear<T, float>(x, w.router.get<T>(), nullptr, Tn, E, H,
                                           logits_.get<float>(), stream)));
    RETURN_IF_ERROR(kc::MoeRoute(logits_.get<float>(), Tn, p, ids_.get<int32_t>(),
                                 weights_.get<float>(), stream));
    if (shared) RETURN_IF_ERROR(SharedExpert<T>(w, x, Tn, gemm, stream));
  }
  // The received rows' routing (this rank's slots, the zero expert elsewhere) replaces the
  // global one in ids_ / weights_ once the rows are packed.
  ASSIGN_OR_RETURN(const int64_t R,
                   all_to_all_->Dispatch<T>(x, Tn, ids_.get<int32_t>(), weights_.get<float>(),
                                            load_.get<int64_t>() + layer * E, ids_.get<int32_t>(),
                                            weights_.get<float>(), stream, dispatch_capacity_));
  if (R > 0) {
    const kc::DeviceMoePermutation perm{offsets_.get<int32_t>(), active_.get<int32_t>(),
                                        token_of_row_.get<int32_t>(), row_of_pair_.get<int32_t>()};
    RETURN_IF_ERROR(kc::MoePermute(ids_.get<int32_t>(), R, k, experts_, perm, nullptr, stream));
    const T* rows = all_to_all_->received_x<T>();
    const int32_t* row_map = nullptr;
    RETURN_IF_ERROR(Experts<T>(w, rows, R, &row_map, stream));
    T* sums = all_to_all_->expert_out<T>();  // one row per received row, no shared expert
    if (kernels_.split_combine) {
      RETURN_IF_ERROR(kc::MoeCombineSplit<T>(expert_out_.get<T>(), weights_.get<float>(), row_map,
                                             R, k, H, nullptr, nullptr, rows, sums, stream));
    } else {
      RETURN_IF_ERROR(kc::MoeCombine<T>(expert_out_.get<T>(), weights_.get<float>(), row_map, R, k,
                                        H, nullptr, nullptr, rows, sums, stream));
    }
  }
  return all_to_all_->Combine<T>(
      Tn, shared ? shared_out_.get<T>() : nullptr,
      w.shared_expert_gate.empty() ? nullptr : w.shared_expert_gate.get<T>(), x, out, stream);
}

template absl::Status CudaMoeMlp::ForwardDispatched<__nv_bfloat16>(const CudaMoeWeights&,
                                                                   const __nv_bfloat16*, int64_t,
                                                                   int64_t, __nv_bfloat16*,
                                                                   kc::CublasLtGemm&, cudaStream_t);
template absl::Status CudaMoeMlp::ForwardDispatched<__half>(const CudaMoeWeights&, const __half*,
                                                            int64_t, int64_t, __half*,
                                                            kc::CublasLtGemm&, cudaStream_t);

}  // namespace tandem::runtime::cuda
