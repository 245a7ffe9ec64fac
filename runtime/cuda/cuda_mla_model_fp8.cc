// CudaMlaModel's FP8 projections (issue 38; cuda_fp8_linear.h): a DeepSeek-V3 FP8 checkpoint's
// q_a_proj, q_b_proj (q_proj), kv_a_proj_with_mqa, o_proj and the dense layers' gate_up / down
// stay e4m3 with their 128 x 128 block scales (per-row 128-column groups as the loader holds
// them) and run through CudaFp8Linear with 1 x 128 activation quantization, as on the CPU
// backend (runtime/cpu/mla_model.cc). kv_b_proj is dequantized at load for the absorbed
// attention (runtime/model/weight_fp8.cc, as vLLM does); the experts are CudaMoeMlp's
// (cuda_moe_fp8.h). Device dummy weights of an FP8 config: AllocateFp8Dummy +
// FillFp8DummyProjection, the codes and scales the host's QuantizeWeightsFp8 gives its draw.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_cuda.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/cuda_moe_fp8.h"
#include "runtime/cuda/dense_linear.h"

namespace tandem::runtime::cuda {

absl::Status CudaMlaModel::UploadFp8(LayerWeights* src, Layer* dst) {
  // CudaModelOptions::fp8_weight_only_fold also picks CudaFp8Linear's batch-1 W8A16 GEMV for
  // weights with per-128-column scales (TANDEM_FP8_W16_GEMV=0 turns it off in any case).
  if (fp8_ != nullptr) fp8_->set_w8a16_gemv(fp8_->w8a16_gemv() && options_.fp8_weight_only_fold);
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Rq = c.q_lora_rank;
  const int64_t Hq = dims_.num_heads, T = options_.max_tokens, q_in = Rq > 0 ? Rq : H;
  auto up = [&](Fp8LinearWeight* w, int64_t rows, int64_t cols, const char* what,
                CudaFp8Weight* out) -> absl::Status {
    if (w->empty()) return absl::OkStatus();  // 16-bit in this checkpoint
    ASSIGN_OR_RETURN(*out, UploadFp8Weight(w, rows, cols, T, what));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(up(&src->q_a_fp8, Rq, H, "q_a_proj", &dst->q_a_fp8));
  RETURN_IF_ERROR(up(&src->q_fp8, Hq * dims_.QkHeadDim(), q_in, "q_proj", &dst->q_fp8));
  if (!src->kv_a_fp8.empty()) RETURN_IF_ERROR(UploadKvA(&src->kv_a_fp8, dst));
  RETURN_IF_ERROR(
      up(&src->o_fp8, H, Hq / options_.dcp.size * dims_.v_head_dim, "o_proj", &dst->o_fp8));
  RETURN_IF_ERROR(up(&src->gate_up_fp8, 2 * I, H, "gate_up_proj", &dst->gate_up_fp8));
  RETURN_IF_ERROR(up(&src->down_fp8, H, I, "down_proj", &dst->down_fp8));
  for (const CudaFp8Weight* w : {&dst->q_a_fp8, &dst->q_fp8, &dst->kv_a_c_fp8, &dst->kv_a_pe_fp8,
                                 &dst->o_fp8, &dst->gate_up_fp8, &dst->down_fp8}) {
    weight_bytes_ += w->bytes();
  }
  return absl::OkStatus();
}

absl::Status CudaMlaModel::UploadKvA(Fp8LinearWeight* kv_a, Layer* dst) {
  // Its c_kv rows and its k_pe rows, two products.
  const int64_t H = config_.hidden_size, L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim;
  if (kv_a->grid.rows != L + Dr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 kv_a_proj_with_mqa has ", kv_a->grid.rows, " rows, expected ", L + Dr));
  }
  Fp8LinearWeight ckv = Fp8Rows(*kv_a, 0, L), kpe = Fp8Rows(*kv_a, L, Dr);
  *kv_a = Fp8LinearWeight();
  const int64_t T = options_.max_tokens;
  ASSIGN_OR_RETURN(dst->kv_a_c_fp8,
                   UploadFp8Weight(&ckv, L, H, T, "kv_a_proj_with_mqa (c_kv rows)"));
  ASSIGN_OR_RETURN(dst->kv_a_pe_fp8,
                   UploadFp8Weight(&kpe, Dr, H, T, "kv_a_proj_with_mqa (k_pe rows)"));
  return absl::OkStatus();
}

absl::Status CudaMlaModel::AllocateFp8Dummy() {
  // CudaModelOptions::fp8_weight_only_fold also picks CudaFp8Linear's batch-1 W8A16 GEMV for
  // weights with per-128-column scales (TANDEM_FP8_W16_GEMV=0 turns it off in any case).
  if (fp8_ != nullptr) fp8_->set_w8a16_gemv(fp8_->w8a16_gemv() && options_.fp8_weight_only_fold);
  const ModelConfig& c = config_;
  const WeightQuantization& q = c.quantization;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Rq = c.q_lora_rank;
  const int64_t Hq = dims_.num_heads, T = options_.max_tokens, q_in = Rq > 0 ? Rq : H;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer& d = layers_[l];
    if (Rq > 0) {
      ASSIGN_OR_RETURN(d.q_a_fp8, AllocateFp8DummyWeight(q, Rq, H, T));
    }
    ASSIGN_OR_RETURN(d.q_fp8, AllocateFp8DummyWeight(q, Hq * dims_.QkHeadDim(), q_in, T));
    ASSIGN_OR_RETURN(d.o_fp8,
                     AllocateFp8DummyWeight(q, H, Hq / options_.dcp.size * dims_.v_head_dim, T));
    if (!c.IsMoeLayer(l)) {
      ASSIGN_OR_RETURN(d.gate_up_fp8, AllocateFp8DummyWeight(q, 2 * I, H, T));
      ASSIGN_OR_RETURN(d.down_fp8, AllocateFp8DummyWeight(q, H, I, T));
    }
    // kv_a_c_fp8 / kv_a_pe_fp8: FillFp8DummyProjection, from the whole tensor's draw.
    for (const CudaFp8Weight* w : {&d.q_a_fp8, &d.q_fp8, &d.o_fp8, &d.gate_up_fp8, &d.down_fp8}) {
      weight_bytes_ += w->bytes();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaMlaModel::FillFp8DummyProjection(const DummyTensorFill& f, uint64_t seed,
                                                          DeviceBuffer* staging,
                                                          cudaStream_t stream) {
  if (f.layer < 0 || f.layer >= config_.num_hidden_layers) return false;
  Layer& d = layers_[f.layer];
  const WeightQuantization& q = config_.quantization;
  const int64_t H = config_.hidden_size, L = dims_.kv_lora_rank, T = options_.max_tokens;
  CudaFp8Weight* target = nullptr;
  switch (f.slot) {
    case WeightSlot::kMlaQAProj:
      target = &d.q_a_fp8;
      break;
    case WeightSlot::kMlaQProj:
      target = &d.q_fp8;
      break;
    case WeightSlot::kOProj:
      target = &d.o_fp8;
      break;
    case WeightSlot::kGateUpProj:
      target = &d.gate_up_fp8;
      break;
    case WeightSlot::kDownProj:
      target = &d.down_fp8;
      break;
    case WeightSlot::kMlaKvAProj: {  // drawn whole (replicated), then split as a checkpoint's
      ASSIGN_OR_RETURN(CudaFp8Weight whole,
                       AllocateFp8DummyWeight(q, L + dims_.qk_rope_head_dim, H, T));
      RETURN_IF_ERROR(FillFp8Dummy(f, seed, staging, &whole, stream));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      Fp8LinearWeight host;
      host.grid = whole.grid;
      host.activation = whole.activation;
      host.codes.resize(static_cast<size_t>(whole.codes.bytes()));
      host.scales.resize(static_cast<size_t>(whole.scales.bytes() / 4));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(host.codes.data(), whole.codes.data(), whole.codes.bytes(),
                                      cudaMemcpyDeviceToHost));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(host.scales.data(), whole.scales.data(), whole.scales.bytes(),
                                      cudaMemcpyDeviceToHost));
      RETURN_IF_ERROR(UploadKvA(&host, &d));
      weight_bytes_ += d.kv_a_c_fp8.bytes() + d.kv_a_pe_fp8.bytes();
      return true;
    }
    case WeightSlot::kMlaKvBProj: {  // quantized, then widened into kv_b_proj as the loader does
      const int64_t rows = f.slice.numel() / L;
      if (f.offset % L != 0 || (f.offset + f.slice.numel()) * 2 > d.kv_b_proj.bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dummy plan does not fit the MLA model's kv_b_proj: layer ", f.layer,
                         " elements [", f.offset, ", ", f.offset + f.slice.numel(), ")"));
      }
      ASSIGN_OR_RETURN(CudaFp8Weight part, AllocateFp8DummyWeight(q, rows, L, T));
      DummyTensorFill local = f;
      local.offset = 0;
      RETURN_IF_ERROR(FillFp8Dummy(local, seed, staging, &part, stream));
      RETURN_IF_ERROR(kernels::cuda::DequantizeWeight(
          part.codes.get<uint8_t>(), part.scales.get<float>(), part.grid,
          d.kv_b_proj.get<__nv_bfloat16>() + f.offset, stream));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before `part` is freed
      return true;
    }
    default:
      return false;
  }
  if (target->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dummy plan does not fit the FP8 MLA model: slot ", static_cast<int>(f.slot),
                     " layer ", f.layer));
  }
  RETURN_IF_ERROR(FillFp8Dummy(f, seed, staging, target, stream));
  return true;
}

template <typename T>
absl::Status CudaMlaModel::Project(const CudaFp8Weight& fp8, const T* w, const T* a, int64_t m,
                                   int64_t n, int64_t k, T* out, cudaStream_t stream,
                                   bool fp8_codes_ready) {
  if (fp8.empty()) {
    return DenseLinear<T, T>(*gemm_, a, w, nullptr, m, n, k, out, stream,
                             options_.programmatic_launch);
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (fp8_ != nullptr) {
      return fp8_->Linear(a, fp8, nullptr, m, out, stream, options_.programmatic_launch,
                          fp8_codes_ready);
    }
  }
  return absl::FailedPreconditionError("FP8 projections run with bf16 activations only");
}

bool CudaMlaModel::SharesFp8Codes(const CudaFp8Weight& first, const CudaFp8Weight& next,
                                  int64_t m) const {
  return fp8_ != nullptr && options_.dtype == ActDtype::kBf16 && !first.empty() && !next.empty() &&
         first.activation == next.activation && first.grid.cols == next.grid.cols &&
         fp8_->TakesTokenCodes(first, m) && fp8_->TakesTokenCodes(next, m) &&
         // one layout of the group scales for both (CudaFp8Linear::GroupMajorScales)
         fp8_->GroupMajorScales(first, m) == fp8_->GroupMajorScales(next, m);
}

template absl::Status CudaMlaModel::Project<__nv_bfloat16>(const CudaFp8Weight&,
                                                           const __nv_bfloat16*,
                                                           const __nv_bfloat16*, int64_t, int64_t,
                                                           int64_t, __nv_bfloat16*, cudaStream_t,
                                                           bool);
template absl::Status CudaMlaModel::Project<__half>(const CudaFp8Weight&, const __half*,
                                                    const __half*, int64_t, int64_t, int64_t,
                                                    __half*, cudaStream_t, bool);

}  // namespace tandem::runtime::cuda
