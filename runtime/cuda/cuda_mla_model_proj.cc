// CudaMlaModel's attention input products (cuda_mla_model.h): q (q_proj, or
// q_a_proj -> q_a_layernorm -> q_b_proj) and kv_a_proj_with_mqa (c_kv ->
// kv_a_layernorm, k_pe) from the normed hidden rows. A one-token step runs them
// on the 16-bit GEMVs (dense_linear.h): q_a_layernorm inside q_b_proj's GEMV
// (SmallMLinearNormIn: bit-identical to the norm kernel and the GEMV),
// kv_a_proj_with_mqa as one product of L + Dr rows; in a folded step (FoldsNorms) q_a_proj (or
// q_proj) and kv_a_proj_with_mqa with the input RMSNorm in their prologue. With
// options.mla_norm_in_write (a 16-bit latent pool) kv_a_layernorm is left to the latent write
// (MlaWriteLatentNormed). FP8 projections of the same hidden rows share one quantization
// (SharesFp8Codes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/dense_linear.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

}  // namespace

template <typename T>
absl::StatusOr<T*> CudaMlaModel::ProjectQKv(const Layer& w, int64_t Tn, bool fold,
                                            bool norm_in_write, cudaStream_t stream) {
  const int64_t H = config_.hidden_size, Rq = config_.q_lora_rank,
                Nq = dims_.num_heads * dims_.QkHeadDim();
  const int64_t L = dims_.kv_lora_rank, Dr = dims_.qk_rope_head_dim;
  const bool pdl = options_.programmatic_launch;
  const T* hidden = hidden_.get<T>();
  T* q = q_.get<T>();
  T* q_lora = q_lora_.get<T>();
  // fold (FoldsNorms: one token, every product on the GEMV): the input RMSNorm of residual_ in
  // the first products' prologue, bit-identical to the norm kernel into hidden_ + the GEMV.
  const T* residual = residual_.get<T>();
  const T* input_norm = w.input_layernorm.get<T>();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  T* ckv = ckv_.get<T>();
  T* kpe = kpe_.get<T>();
  const T* kv_a = w.kv_a_proj.get<T>();
  if (Rq > 0) {
    if (fold) {
      RETURN_IF_ERROR(kc::SmallMLinearNormIn<T>(residual, input_norm, eps, w.q_a_proj.get<T>(),
                                                nullptr, Tn, Rq, H, q_lora, stream, pdl));
    } else {
      RETURN_IF_ERROR(Project(w.q_a_fp8, w.q_a_proj.get<T>(), hidden, Tn, Rq, H, q_lora, stream));
    }
    const T* norm = w.q_a_layernorm.get<T>();
    if (w.q_fp8.empty() && UseGemv(q_lora, w.q_proj.data(), Tn, Nq, Rq) &&
        kc::SmallMLinearNormInSupported(q_lora, norm, w.q_proj.data(), Tn, Nq, Rq)) {
      RETURN_IF_ERROR(kc::SmallMLinearNormIn<T>(q_lora, norm, kLatentNormEps, w.q_proj.get<T>(),
                                                nullptr, Tn, Nq, Rq, q, stream, pdl));
    } else {
      RETURN_IF_ERROR(kc::RmsNorm<T>(q_lora, norm, Tn, Rq, kLatentNormEps, q_lora, stream, pdl));
      RETURN_IF_ERROR(Project(w.q_fp8, w.q_proj.get<T>(), q_lora, Tn, Nq, Rq, q, stream));
    }
  } else if (fold) {
    RETURN_IF_ERROR(kc::SmallMLinearNormIn<T>(residual, input_norm, eps, w.q_proj.get<T>(), nullptr,
                                              Tn, Nq, H, q, stream, pdl));
  } else {
    RETURN_IF_ERROR(Project(w.q_fp8, w.q_proj.get<T>(), hidden, Tn, Nq, H, q, stream));
  }
  // kv_a_proj_with_mqa as two products, so c_kv and k_pe are dense rows of
  // their own; a single token's on the GEMV as one product of L + Dr rows (its
  // k_pe right after its c_kv in ckv_).
  if (fold) {
    kpe = ckv + L;
    RETURN_IF_ERROR(kc::SmallMLinearNormIn<T>(residual, input_norm, eps, kv_a, nullptr, Tn, L + Dr,
                                              H, ckv, stream, pdl));
  } else if (Tn == 1 && w.kv_a_c_fp8.empty() && w.kv_a_pe_fp8.empty() &&
             UseGemv(hidden, kv_a, Tn, L + Dr, H)) {
    kpe = ckv + L;
    RETURN_IF_ERROR(DenseLinear(*gemm_, hidden, kv_a, static_cast<const T*>(nullptr), Tn, L + Dr, H,
                                ckv, stream, pdl));
  } else {
    // FP8: the hidden rows' codes quantized once for q_proj (no q_lora: nothing in between
    // rewrote the workspace) and kv_a_proj_with_mqa's two parts.
    const bool c_codes = Rq == 0 && SharesFp8Codes(w.q_fp8, w.kv_a_c_fp8, Tn);
    RETURN_IF_ERROR(Project(w.kv_a_c_fp8, kv_a, hidden, Tn, L, H, ckv, stream, c_codes));
    RETURN_IF_ERROR(Project(w.kv_a_pe_fp8, kv_a + L * H, hidden, Tn, Dr, H, kpe, stream,
                            SharesFp8Codes(w.kv_a_c_fp8, w.kv_a_pe_fp8, Tn)));
  }
  if (!norm_in_write) {  // else MlaWriteLatentNormed norms c_kv as it writes the latent
    RETURN_IF_ERROR(kc::RmsNorm<T>(ckv, w.kv_a_layernorm.get<T>(), Tn, L, kLatentNormEps,
                                   ckv_normed_.get<T>(), stream, pdl));
  }
  return kpe;
}

template absl::StatusOr<__nv_bfloat16*> CudaMlaModel::ProjectQKv<__nv_bfloat16>(const Layer&,
                                                                                int64_t, bool, bool,
                                                                                cudaStream_t);
template absl::StatusOr<__half*> CudaMlaModel::ProjectQKv<__half>(const Layer&, int64_t, bool, bool,
                                                                  cudaStream_t);

}  // namespace tandem::runtime::cuda
