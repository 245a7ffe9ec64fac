// cuBLASLt nn.Linear. cuBLASLt is column-major, so the row-major product out = a * w^T is
// computed as its transpose: out^T [n x m] = w [k x n]^T * a^T [k x m], where a row-major
// [m, k] buffer is a column-major k x m matrix with ld = k, and likewise w and out. The bias
// epilogue adds a vector over D's rows, which are out's columns: exactly bias[n].
#include "kernels/gemm/cuda/gemm_cuda.h"

#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/gemm/cuda/cublaslt_algo_tuner.h"
#include "kernels/layers/cuda/convert_cuda.h"

namespace tandem::kernels::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t CudaType() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return CUDA_R_16BF;
  } else if constexpr (std::is_same_v<T, __half>) {
    return CUDA_R_16F;
  } else {
    static_assert(std::is_same_v<T, float>);
    return CUDA_R_32F;
  }
}

// Largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption).
uint16_t AlignmentOf(const void* p) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr == 0) return 256;
  const uintptr_t low = addr & (~addr + 1);
  return static_cast<uint16_t>(low < 256 ? low : 256);
}

template <typename Attr, typename V>
cublasStatus_t SetDescAttr(cublasLtMatmulDesc_t desc, Attr attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

}  // namespace

// Heuristic candidates timed per tuned plan.
constexpr int kTuneCandidates = kCublasLtTuneCandidates;

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr;    // cuBLASLt's A
  cublasLtMatrixLayout_t a_layout = nullptr;    // cuBLASLt's B
  cublasLtMatrixLayout_t out_layout = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;  // false with a bias: AddBias runs after the product
  // Heuristic candidates (best first) until Tune() picked one; empty afterwards.
  std::vector<cublasLtMatmulAlgo_t> candidates;

  ~Plan() {
    if (out_layout != nullptr) cublasLtMatrixLayoutDestroy(out_layout);
    if (a_layout != nullptr) cublasLtMatrixLayoutDestroy(a_layout);
    if (w_layout != nullptr) cublasLtMatrixLayoutDestroy(w_layout);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<CublasLtGemm>> CublasLtGemm::Create(int64_t workspace_bytes) {
  if (workspace_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CublasLtGemm: workspace_bytes must be >= 0, got ", workspace_bytes));
  }
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace, static_cast<size_t>(workspace_bytes)));
  }
  cublasLtHandle_t handle = nullptr;
  const absl::Status created =
      CublasStatus(cublasLtCreate(&handle), {"cublasLtCreate(&handle)", __FILE__, __LINE__});
  if (!created.ok()) {
    if (workspace != nullptr) cudaFree(workspace);
    return created;
  }
  return std::unique_ptr<CublasLtGemm>(new CublasLtGemm(handle, workspace, workspace_bytes));
}

CublasLtGemm::CublasLtGemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes)
    : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();  // descriptors before the handle
  cublasLtDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

absl::StatusOr<CublasLtGemm::Plan*> CublasLtGemm::GetPlan(const PlanKey& key, const void* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  auto plan = std::make_unique<Plan>();
  const auto in_type = static_cast<cudaDataType_t>(key.in_type);
  const auto out_type = static_cast<cudaDataType_t>(key.out_type);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->w_layout, in_type, key.k, key.n, /*ld=*/key.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a_layout, in_type, key.k, key.m, /*ld=*/key.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->out_layout, out_type, key.n, key.m, /*ld=*/key.n));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefDeleter {
    cublasLtMatmulPreference_t p;
    ~PrefDeleter() { cublasLtMatmulPreferenceDestroy(p); }
  } pref_deleter{pref};
  const uint64_t max_workspace = static_cast<uint64_t>(workspace_bytes_);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  const uint32_t align_w = key.align_w, align_a = key.align_a, align_out = key.align_out;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a, sizeof(align_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_out, sizeof(align_out)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_out, sizeof(align_out)));

  // Best heuristic algorithm. NOT_SUPPORTED, INVALID_VALUE (cuBLASLt 13's answer for a bf16
  // bias with fp32 D, seen on H200) or no result: none fits (our arguments were validated
  // before); `refusal` keeps the reason for the message.
  const char* refusal = "no algorithm returned";
  const int wanted = key.m <= autotune_max_m_ ? kTuneCandidates : 1;
  auto query = [&](int* found) -> absl::Status {
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan->desc, plan->w_layout, plan->a_layout, plan->out_layout, plan->out_layout,
        pref, wanted, results, found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
      *found = 0;
      refusal = cublasGetStatusName(st);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CublasStatus(st, {"cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__}));
    if (*found > 0) plan->algo = results[0].algo;
    plan->candidates = TuneCandidates(results, *found);
    return absl::OkStatus();
  };

  int found = 0;
  if (key.bias && key.out_type == key.in_type) {
    // The epilogue's bias has D's type here. For fp32 D cuBLASLt rejects a T bias, so it goes
    // through AddBias (an fp32 add after the product).
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS));
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                       static_cast<int32_t>(in_type)));
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
    RETURN_IF_ERROR(query(&found));
    plan->bias_in_epilogue = found > 0;
    if (found == 0) {
      // No fused kernel for this shape: plain product, then AddBias.
      CUBLAS_RETURN_IF_ERROR(
          SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT));
    }
  }
  if (found == 0) RETURN_IF_ERROR(query(&found));
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "CublasLtGemm::Linear: cuBLASLt has no algorithm for m=", key.m, " n=", key.n, " k=", key.k,
        " in_type=", key.in_type, " out_type=", key.out_type, " alignments (a, w, out) = ",
        key.align_a, ", ", key.align_w, ", ", key.align_out, " bytes (heuristic: ", refusal, ")"));
  }
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CublasLtGemm::Tune(Plan* plan, const void* a, const void* w, void* out,
                                cudaStream_t stream) {
  const std::vector<cublasLtMatmulAlgo_t> candidates = std::move(plan->candidates);
  plan->candidates.clear();  // tuned once, whatever happens below
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->w_layout, a, plan->a_layout, &beta,
                          out, plan->out_layout, out, plan->out_layout, &algo, workspace_,
                          static_cast<size_t>(workspace_bytes_), stream);
  };
  ASSIGN_OR_RETURN(const int best, FastestCandidate(candidates, launch, stream));
  if (best >= 0) plan->algo = candidates[best];
  return absl::OkStatus();
}

template <typename T, typename TOut>
absl::Status CublasLtGemm::Linear(const T* a, const T* w, const T* bias, int64_t m, int64_t n,
                                  int64_t k, TOut* out, cudaStream_t stream) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  static_assert(std::is_same_v<TOut, T> || std::is_same_v<TOut, float>);
  if (m < 0 || n < 0 || k < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CublasLtGemm::Linear: need m >= 0, n >= 0, k >= 1, got m=", m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (a == nullptr || w == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("CublasLtGemm::Linear: null a, w or out");
  }
  const PlanKey key{.m = m,
                    .n = n,
                    .k = k,
                    .in_type = CudaType<T>(),
                    .out_type = CudaType<TOut>(),
                    .bias = bias != nullptr,
                    .align_a = AlignmentOf(a),
                    .align_w = AlignmentOf(w),
                    .align_out = AlignmentOf(out),
                    .align_bias = AlignmentOf(bias)};
  ASSIGN_OR_RETURN(Plan * plan, GetPlan(key, bias));
  if (plan->bias_in_epilogue) {
    const void* bias_ptr = bias;
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr));
  }
  if (!plan->candidates.empty()) {
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(stream));
    if (!capturing) RETURN_IF_ERROR(Tune(plan, a, w, out, stream));
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->w_layout, a,
                                        plan->a_layout, &beta, out, plan->out_layout, out,
                                        plan->out_layout, &plan->algo, workspace_,
                                        static_cast<size_t>(workspace_bytes_), stream));
  if (bias != nullptr && !plan->bias_in_epilogue) {
    RETURN_IF_ERROR((AddBias<TOut, T>(out, bias, m, n, stream)));
  }
  return absl::OkStatus();
}

template absl::Status CublasLtGemm::Linear<__nv_bfloat16, __nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t, int64_t,
    __nv_bfloat16*, cudaStream_t);
template absl::Status CublasLtGemm::Linear<__nv_bfloat16, float>(const __nv_bfloat16*,
                                                                 const __nv_bfloat16*,
                                                                 const __nv_bfloat16*, int64_t,
                                                                 int64_t, int64_t, float*,
                                                                 cudaStream_t);
template absl::Status CublasLtGemm::Linear<__half, __half>(const __half*, const __half*,
                                                           const __half*, int64_t, int64_t, int64_t,
                                                           __half*, cudaStream_t);
template absl::Status CublasLtGemm::Linear<__half, float>(const __half*, const __half*,
                                                          const __half*, int64_t, int64_t, int64_t,
                                                          float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
