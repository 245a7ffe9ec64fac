#include "kernels/fp8/fp8_gemm_cuda.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

template <typename Attr, typename V>
cublasStatus_t SetDescAttr(cublasLtMatmulDesc_t desc, Attr attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// One shape's descriptors and algorithm. In cuBLASLt's column-major terms D[n, m] =
// op(A)[n, k] . B[k, m] with A = w (transposed: the "TN" layout FP8 matmul requires) and B = a.
struct CublasLtFp8Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr;
  cublasLtMatrixLayout_t out_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (out_layout != nullptr) cublasLtMatrixLayoutDestroy(out_layout);
    if (a_layout != nullptr) cublasLtMatrixLayoutDestroy(a_layout);
    if (w_layout != nullptr) cublasLtMatrixLayoutDestroy(w_layout);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> CublasLtFp8Gemm::Create(int64_t workspace_bytes,
                                                                         int64_t accumulator_bytes,
                                                                         bool try_outer_vector) {
  if (workspace_bytes < 0 || accumulator_bytes < 0) {
    return absl::InvalidArgumentError("negative workspace or accumulator size");
  }
  cublasLtHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  void* workspace = nullptr;
  if (workspace_bytes > 0 && cudaMalloc(&workspace, workspace_bytes) != cudaSuccess) {
    cublasLtDestroy(handle);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", workspace_bytes, "-byte cuBLASLt workspace"));
  }
  void* accumulator = nullptr;
  if (accumulator_bytes > 0 && cudaMalloc(&accumulator, accumulator_bytes) != cudaSuccess) {
    if (workspace != nullptr) cudaFree(workspace);
    cublasLtDestroy(handle);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", accumulator_bytes, "-byte FP8 GEMM accumulator"));
  }
  std::unique_ptr<CublasLtFp8Gemm> gemm(new CublasLtFp8Gemm(
      handle, workspace, workspace_bytes, static_cast<float*>(accumulator), accumulator_bytes));
  // One heuristic query (host only): does this cuBLASLt / GPU have outer-vector FP8 kernels?
  // On sm_90 it has none; the plan is kept where it exists.
  if (try_outer_vector) {
    gemm->outer_vector_ = gemm->GetPlan(PlanKey{256, 256, 256, kOuterVectorPlan}).ok();
  }
  return gemm;
}

CublasLtFp8Gemm::CublasLtFp8Gemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
                                 float* accumulator, int64_t accumulator_bytes)
    : handle_(handle),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      accumulator_(accumulator),
      accumulator_bytes_(accumulator_bytes) {}

CublasLtFp8Gemm::~CublasLtFp8Gemm() {
  plans_.clear();
  if (accumulator_ != nullptr) cudaFree(accumulator_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

int64_t CublasLtFp8Gemm::EpilogueChunkRows(int64_t n) const {
  if (n < 1) return 0;
  const int64_t rows = accumulator_bytes_ / (n * int64_t{sizeof(float)});
  // Whole 128-row tiles where the accumulator holds at least one (fewer plans, full tiles).
  return rows >= 128 ? rows / 128 * 128 : rows;
}

absl::StatusOr<CublasLtFp8Gemm::Plan*> CublasLtFp8Gemm::GetPlan(const PlanKey& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  const auto [m, n, k, kind] = key;
  auto plan = std::make_unique<Plan>();
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  // Full-precision accumulation (no fast FP8 accumulation: DeepSeek-V3's paper shows its error).
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0}));
  if (kind == kOuterVectorPlan) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode));
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode));
  }
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->w_layout, CUDA_R_8F_E4M3, k, n, /*ld=*/k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a_layout, CUDA_R_8F_E4M3, k, m, /*ld=*/k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan->out_layout, kind == kUnscaledF32Plan ? CUDA_R_32F : CUDA_R_16BF, n, m,
      /*ld=*/n));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = static_cast<uint64_t>(workspace_bytes_);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->w_layout, plan->a_layout,
                                        plan->out_layout, plan->out_layout, pref, 1, &result,
                                        &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt has no FP8 matmul for m=", m, " n=", n, " k=", k, " with ",
                     kind == kTensorPlan        ? "per-tensor scales"
                     : kind == kOuterVectorPlan ? "outer-vector scales"
                                                : "unit scales and an fp32 output",
                     " (status ", static_cast<int>(st), ", ", found, " algorithms)"));
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CublasLtFp8Gemm::Linear(const uint8_t* a_codes, const float* a_scales,
                                     const uint8_t* w_codes, const float* w_scales,
                                     Fp8GemmScaling scaling, int64_t m, int64_t n, int64_t k,
                                     __nv_bfloat16* out, cudaStream_t stream,
                                     const __nv_bfloat16* bias) {
  if (scaling == Fp8GemmScaling::kBlock128) {
    return absl::UnimplementedError(
        "FP8 GEMM with 128x128 weight blocks and 1x128 activation groups is not wired yet "
        "(cuBLASLt's BLK128x128_32F / VEC128_32F scale modes)");
  }
  if (m < 0 || n < 0 || k < 16 || k % 16 != 0 || a_codes == nullptr || w_codes == nullptr ||
      a_scales == nullptr || w_scales == nullptr || out == nullptr || !Aligned16(a_codes) ||
      !Aligned16(w_codes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CublasLtFp8Gemm::Linear: needs m, n >= 0, k a positive multiple of 16, 16-byte aligned "
        "codes and non-null scales / out; got m=",
        m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  const bool tensor = scaling == Fp8GemmScaling::kTensor;
  if (!tensor && !outer_vector_) {
    return EpilogueLinear(a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias, stream);
  }
  absl::StatusOr<Plan*> plan = GetPlan(PlanKey{m, n, k, tensor ? kTensorPlan : kOuterVectorPlan});
  if (!plan.ok()) {
    // An outer-vector shape cuBLASLt lacks: the epilogue path.
    if (!tensor && absl::IsUnimplemented(plan.status())) {
      return EpilogueLinear(a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias, stream);
    }
    return plan.status();
  }
  Plan* p = *plan;
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                     static_cast<const void*>(w_scales)));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                     static_cast<const void*>(a_scales)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, p->desc, &alpha, w_codes, p->w_layout, a_codes,
                                        p->a_layout, &beta, out, p->out_layout, out, p->out_layout,
                                        &p->algo, workspace_, static_cast<size_t>(workspace_bytes_),
                                        stream));
  return bias == nullptr ? absl::OkStatus() : AddBias(out, bias, m, n, stream);
}

// Per-token x per-channel without cuBLASLt's outer-vector mode: for each chunk of rows, the
// unit-scaled FP8 product in fp32 (cuBLASLt), then acc * a_scale[i] * w_scale[j] (+ bias) to
// bf16 (ScaleFp8Accumulator). The chunks reuse the accumulator in stream order.
absl::Status CublasLtFp8Gemm::EpilogueLinear(const uint8_t* a_codes, const float* a_scales,
                                             const uint8_t* w_codes, const float* w_scales,
                                             int64_t m, int64_t n, int64_t k, __nv_bfloat16* out,
                                             const __nv_bfloat16* bias, cudaStream_t stream) {
  const int64_t chunk = EpilogueChunkRows(n);
  if (chunk < 1) {
    return absl::ResourceExhaustedError(absl::StrCat("FP8 GEMM accumulator of ", accumulator_bytes_,
                                                     " bytes holds no row of n=", n,
                                                     " fp32 outputs"));
  }
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = std::min(chunk, m - r0);
    ASSIGN_OR_RETURN(Plan * p, GetPlan(PlanKey{rows, n, k, kUnscaledF32Plan}));
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmul(handle_, p->desc, &alpha, w_codes, p->w_layout, a_codes + r0 * k,
                       p->a_layout, &beta, accumulator_, p->out_layout, accumulator_, p->out_layout,
                       &p->algo, workspace_, static_cast<size_t>(workspace_bytes_), stream));
    RETURN_IF_ERROR(ScaleFp8Accumulator(accumulator_, a_scales + r0, w_scales, bias, rows, n,
                                        out + r0 * n, stream));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
