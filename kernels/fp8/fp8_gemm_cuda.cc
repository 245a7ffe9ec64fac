#include "kernels/fp8/fp8_gemm_cuda.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_block_gemm_cuda.h"
#include "kernels/fp8/fp8_cuda.h"
#ifdef TANDEM_HAVE_CUTLASS
#include "kernels/fp8/cutlass/cutlass_block_gemm.h"
#endif

namespace tandem::kernels::cuda {
namespace {

template <typename Attr, typename V>
cublasStatus_t SetDescAttr(cublasLtMatmulDesc_t desc, Attr attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// TANDEM_FP8_BLOCK_GEMM's kernel (nullopt where unset); INVALID_ARGUMENT for another value.
absl::StatusOr<std::optional<Fp8BlockGemmKernel>> BlockKernelFromEnv() {
  const char* env = std::getenv("TANDEM_FP8_BLOCK_GEMM");
  if (env == nullptr) return std::nullopt;
  const std::string_view v(env);
  if (v == "cublaslt") return Fp8BlockGemmKernel::kCublasLt;
  if (v == "cutlass") return Fp8BlockGemmKernel::kCutlass;
  if (v == "wgmma") return Fp8BlockGemmKernel::kWgmma;
  if (v == "wgmma_direct") return Fp8BlockGemmKernel::kWgmmaDirectScales;
  if (v == "wgmma_multicast") return Fp8BlockGemmKernel::kWgmmaMulticast;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_FP8_BLOCK_GEMM=", env,
                   ": the block-scaled FP8 GEMM is cutlass, cublaslt, wgmma, wgmma_direct or "
                   "wgmma_multicast"));
}

// Whether the current device runs `kernel` (kCublasLt: always).
bool BlockKernelSupported(Fp8BlockGemmKernel kernel) {
  if (kernel == Fp8BlockGemmKernel::kCublasLt) return true;
  if (kernel != Fp8BlockGemmKernel::kCutlass) return Fp8BlockGemmWgmmaSupported();
#ifdef TANDEM_HAVE_CUTLASS
  return CutlassFp8BlockGemmSupported();
#else
  return false;
#endif
}

}  // namespace

bool Fp8BlockGemmCutlassBuilt() {
#ifdef TANDEM_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}

bool Fp8BlockGemmCutlassAvailable() { return BlockKernelSupported(Fp8BlockGemmKernel::kCutlass); }

Fp8BlockGemmKernel DefaultFp8BlockGemmKernel() {
  return Fp8BlockGemmCutlassAvailable() ? Fp8BlockGemmKernel::kCutlass
                                        : Fp8BlockGemmKernel::kCublasLt;
}

// One shape's descriptors and algorithm. In cuBLASLt's column-major terms D[n, m] =
// op(A)[n, k] . B[k, m] with A = w (transposed: the "TN" layout FP8 matmul requires) and B = a.
struct CublasLtFp8Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr;
  cublasLtMatrixLayout_t out_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused_bias = false;  // cuBLASLt's BIAS epilogue adds the bias (pointer set per call)
  bool swap_ab = false;     // cuBLASLt's A is the activations (BuildPlan)
  // Heuristic candidates (best first) until Run timed them; empty afterwards or untuned.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  ~Plan() {
    if (out_layout != nullptr) cublasLtMatrixLayoutDestroy(out_layout);
    if (a_layout != nullptr) cublasLtMatrixLayoutDestroy(a_layout);
    if (w_layout != nullptr) cublasLtMatrixLayoutDestroy(w_layout);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::vector<float>> Block128WeightScales(const float* row_scales,
                                                        const Fp8ScaleGrid& grid) {
  const int64_t n = grid.rows, k = grid.cols, groups = Block128Groups(k);
  if (row_scales == nullptr || n < 1 || k < 1 || grid.block_rows != 1 || grid.block_cols != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("Block128WeightScales: needs per-row scales over 128 columns; got [", n, ", ",
                     k, "] with blocks ", grid.block_rows, "x", grid.block_cols));
  }
  const int64_t ld = Block128WeightScaleLd(k);
  std::vector<float> out(static_cast<size_t>((n + 127) / 128 * ld), 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* first = row_scales + (r / 128 * 128) * groups;  // the block's first row
    const float* row = row_scales + r * groups;
    if (!std::equal(row, row + groups, first)) {
      return absl::FailedPreconditionError(absl::StrCat("row ", r, " of the [", n, ", ", k,
                                                        "] FP8 weight has other scales than row ",
                                                        r / 128 * 128, ": not 128 x 128 blocks"));
    }
    if (r % 128 == 0) std::copy(row, row + groups, out.begin() + r / 128 * ld);
  }
  return out;
}

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
    gemm->outer_vector_ = gemm->GetPlan(PlanKey{256, 256, 256, kOuterVectorPlan, false}).ok();
  }
  ASSIGN_OR_RETURN(const std::optional<Fp8BlockGemmKernel> from_env, BlockKernelFromEnv());
  const Fp8BlockGemmKernel block = from_env.value_or(DefaultFp8BlockGemmKernel());
  if (block != Fp8BlockGemmKernel::kCublasLt && BlockKernelSupported(block)) {
    // Asked for by name: every call; the default: large calls only (kCutlassBlockMinRows).
    RETURN_IF_ERROR(gemm->set_block_kernel(block, from_env ? 0 : kCutlassBlockMinRows));
  }
  return gemm;
}

absl::Status CublasLtFp8Gemm::set_block_kernel(Fp8BlockGemmKernel kernel, int64_t min_rows) {
  if (kernel == Fp8BlockGemmKernel::kCutlass) {
#ifdef TANDEM_HAVE_CUTLASS
    RETURN_IF_ERROR(CutlassFp8BlockGemmInit());  // FAILED_PRECONDITION where not sm_90
#else
    return absl::FailedPreconditionError(
        "the CUTLASS block-scaled FP8 GEMM is not built (no CUTLASS headers: "
        "third_party/cutlass/)");
#endif
  } else if (kernel != Fp8BlockGemmKernel::kCublasLt) {
    if (!Fp8BlockGemmWgmmaSupported()) {
      return absl::FailedPreconditionError(
          "the wgmma block-scaled FP8 GEMM needs an sm_90 (Hopper) device");
    }
    RETURN_IF_ERROR(Fp8BlockGemmWgmmaInit());
  }
  block_kernel_ = kernel;
  cutlass_min_rows_ = kernel == Fp8BlockGemmKernel::kCutlass ? std::max<int64_t>(min_rows, 0) : 0;
  return absl::OkStatus();
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
  for (void* p : retired_workspaces_) cudaFree(p);
  if (cutlass_workspace_ != nullptr) cudaFree(cutlass_workspace_);
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

// Descriptors and the heuristic's algorithm for one shape. swap_ab (block scaling only): the
// activations as cuBLASLt's A (VEC128) and the weight as B (BLK128x128), D = [m, n] in row order,
// for a cuBLASLt that only has that operand order. UNIMPLEMENTED when it finds no algorithm.
absl::Status CublasLtFp8Gemm::BuildPlan(const PlanKey& key, bool swap_ab, Plan* plan) {
  const auto [m, n, k, kind, bias] = key;
  plan->swap_ab = swap_ab;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  // Full-precision accumulation (no fast FP8 accumulation: DeepSeek-V3's paper shows its error).
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0}));
  if (kind == kOuterVectorPlan || kind == kBlock128Plan) {
    const int32_t w_mode = kind == kOuterVectorPlan ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t a_mode = kind == kOuterVectorPlan ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, swap_ab ? a_mode : w_mode));
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, swap_ab ? w_mode : a_mode));
    // Vector / block scale modes want their scale pointers set when the heuristic is asked (the
    // query fails with INVALID_VALUE without them); any device address serves, each call sets
    // the real ones.
    const void* placeholder = workspace_;
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, placeholder));
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, placeholder));
  }
  if (bias) {
    // The bias joins the fp32 result before the one conversion to bf16.
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS));
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{CUDA_R_16BF}));
    CUBLAS_RETURN_IF_ERROR(SetDescAttr(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                       static_cast<const void*>(workspace_)));
    plan->fused_bias = true;
  }
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->w_layout, CUDA_R_8F_E4M3, k, n, /*ld=*/k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a_layout, CUDA_R_8F_E4M3, k, m, /*ld=*/k));
  const cudaDataType_t out_type = kind == kUnscaledF32Plan ? CUDA_R_32F : CUDA_R_16BF;
  if (swap_ab) {  // D [m, n] with rows of n: our row-major output
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->out_layout, out_type, m, n, n));
    const int32_t order = CUBLASLT_ORDER_ROW;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        plan->out_layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
  } else {  // D [n, m] column-major, ld n: the same memory
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->out_layout, out_type, n, m, n));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = static_cast<uint64_t>(workspace_bytes_);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  cublasLtMatmulHeuristicResult_t results[kCublasLtTuneCandidates] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    const cublasLtMatrixLayout_t first = swap_ab ? plan->a_layout : plan->w_layout;
    const cublasLtMatrixLayout_t second = swap_ab ? plan->w_layout : plan->a_layout;
    const int wanted = m <= autotune_max_m_ ? kCublasLtTuneCandidates : 1;
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, first, second, plan->out_layout,
                                        plan->out_layout, pref, wanted, results, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt has no FP8 matmul for m=", m, " n=", n, " k=", k, " with ",
                     kind == kTensorPlan        ? "per-tensor scales"
                     : kind == kOuterVectorPlan ? "outer-vector scales"
                     : kind == kBlock128Plan    ? "1x128 / 128x128 block scales"
                                                : "unit scales and an fp32 output",
                     bias ? " and a bias epilogue" : "", swap_ab ? " (operands swapped)" : "",
                     " (status ", static_cast<int>(st), ", ", found, " algorithms)"));
  }
  plan->algo = results[0].algo;
  plan->candidates = TuneCandidates(results, found);
  return absl::OkStatus();
}

absl::Status CublasLtFp8Gemm::Run(Plan* plan, const void* first, const void* second, void* out,
                                  cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(
        handle_, plan->desc, &alpha, first, plan->swap_ab ? plan->a_layout : plan->w_layout, second,
        plan->swap_ab ? plan->w_layout : plan->a_layout, &beta, out, plan->out_layout, out,
        plan->out_layout, &algo, workspace_, static_cast<size_t>(workspace_bytes_), stream);
  };
  if (!plan->candidates.empty()) {
    // Timing synchronizes: never inside a capture (that call keeps the heuristic's first).
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(stream));
    if (!capturing) {
      const std::vector<cublasLtMatmulAlgo_t> candidates = std::move(plan->candidates);
      plan->candidates.clear();  // timed once, whatever happens below
      ++num_tuned_plans_;
      ASSIGN_OR_RETURN(const int best, FastestCandidate(candidates, launch, stream));
      if (best >= 0) plan->algo = candidates[best];
    }
  }
  CUBLAS_RETURN_IF_ERROR(launch(plan->algo));
  return absl::OkStatus();
}

absl::StatusOr<CublasLtFp8Gemm::Plan*> CublasLtFp8Gemm::GetPlan(const PlanKey& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (auto it = no_kernel_.find(key); it != no_kernel_.end()) return it->second;
  auto plan = std::make_unique<Plan>();
  absl::Status st = BuildPlan(key, /*swap_ab=*/false, plan.get());
  if (absl::IsUnimplemented(st) && std::get<3>(key) == kBlock128Plan) {
    auto swapped = std::make_unique<Plan>();
    const absl::Status st2 = BuildPlan(key, /*swap_ab=*/true, swapped.get());
    if (st2.ok() || !absl::IsUnimplemented(st2)) {
      st = st2;
      plan = std::move(swapped);
    } else {
      st = absl::UnimplementedError(absl::StrCat(st.message(), "; ", st2.message()));
    }
  }
  if (absl::IsUnimplemented(st)) no_kernel_.emplace(key, st);  // not asked again per call
  if (!st.ok()) return st;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CublasLtFp8Gemm::Linear(const uint8_t* a_codes, const float* a_scales,
                                     const uint8_t* w_codes, const float* w_scales,
                                     Fp8GemmScaling scaling, int64_t m, int64_t n, int64_t k,
                                     __nv_bfloat16* out, cudaStream_t stream,
                                     const __nv_bfloat16* bias) {
  if (m < 0 || n < 0 || k < 16 || k % 16 != 0 || a_codes == nullptr || w_codes == nullptr ||
      a_scales == nullptr || w_scales == nullptr || out == nullptr || !Aligned16(a_codes) ||
      !Aligned16(w_codes) ||
      (scaling == Fp8GemmScaling::kBlock128 && (!Aligned16(a_scales) || !Aligned16(w_scales)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CublasLtFp8Gemm::Linear: needs m, n >= 0, k a positive multiple of 16, 16-byte aligned "
        "codes (and block scales) and non-null scales / out; got m=",
        m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  switch (scaling) {
    case Fp8GemmScaling::kTensor:
      return ScaledLinear(kTensorPlan, a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias,
                          stream);
    case Fp8GemmScaling::kBlock128:
      if (block_kernel_ == Fp8BlockGemmKernel::kCutlass) {
        // Calls of cutlass_min_rows_ and more, and smaller ones cuBLASLt has no kernel for (a
        // number of 128-column groups off 4, e.g. DeepSeek-V2-Lite's shared experts' k = 2816).
        const bool cublaslt_takes = m % kBlock128RowMultiple == 0 && Block128Groups(k) % 4 == 0;
        if (m >= cutlass_min_rows_ || !cublaslt_takes) {  // else cuBLASLt below
          ASSIGN_OR_RETURN(const bool ran, CutlassBlockLinear(a_codes, a_scales, w_codes, w_scales,
                                                              m, n, k, out, bias, stream));
          if (ran) return absl::OkStatus();
        }
      } else if (block_kernel_ != Fp8BlockGemmKernel::kCublasLt) {
        last_block_kernel_ = block_kernel_;
        Fp8BlockWgmmaForm form;
        if (block_kernel_ == Fp8BlockGemmKernel::kWgmmaDirectScales) {
          form.scales = Fp8BlockScaleLoad::kDirect;
        }
        form.multicast = block_kernel_ == Fp8BlockGemmKernel::kWgmmaMulticast;
        return Fp8BlockGemmWgmma(a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias, stream,
                                 form);
      }
      if (m % kBlock128RowMultiple != 0 || Block128Groups(k) % 4 != 0) {
        // m: cuBLASLt 13 answers NOT_SUPPORTED for other m on sm_90 (17, 129, 333 on an H200).
        // k: the padded weight-scale rows (ld > groups) have not been run on a GPU yet.
        return absl::UnimplementedError(
            absl::StrCat("block-scaled FP8 GEMM: needs m a multiple of ", kBlock128RowMultiple,
                         " and ceil(k / 128) a multiple of 4; got m=", m, " k=", k));
      }
      last_block_kernel_ = Fp8BlockGemmKernel::kCublasLt;
      return ScaledLinear(kBlock128Plan, a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias,
                          stream);
    case Fp8GemmScaling::kTokenChannel:
      break;
  }
  if (outer_vector_) {
    const absl::Status st = ScaledLinear(kOuterVectorPlan, a_codes, a_scales, w_codes, w_scales, m,
                                         n, k, out, bias, stream);
    // An outer-vector shape cuBLASLt lacks: the epilogue path.
    if (!absl::IsUnimplemented(st)) return st;
  }
  return EpilogueLinear(a_codes, a_scales, w_codes, w_scales, m, n, k, out, bias, stream);
}

absl::Status CublasLtFp8Gemm::ScaledLinear(PlanKind kind, const uint8_t* a_codes,
                                           const float* a_scales, const uint8_t* w_codes,
                                           const float* w_scales, int64_t m, int64_t n, int64_t k,
                                           __nv_bfloat16* out, const __nv_bfloat16* bias,
                                           cudaStream_t stream) {
  absl::StatusOr<Plan*> plan = GetPlan(PlanKey{m, n, k, kind, bias != nullptr});
  if (!plan.ok() && bias != nullptr && absl::IsUnimplemented(plan.status())) {
    plan = GetPlan(PlanKey{m, n, k, kind, false});  // no BIAS epilogue kernel: AddBias below
  }
  if (!plan.ok()) return plan.status();
  Plan* p = *plan;
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                     static_cast<const void*>(p->swap_ab ? a_scales : w_scales)));
  CUBLAS_RETURN_IF_ERROR(SetDescAttr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                     static_cast<const void*>(p->swap_ab ? w_scales : a_scales)));
  if (p->fused_bias) {
    CUBLAS_RETURN_IF_ERROR(
        SetDescAttr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias)));
  }
  const void* first = p->swap_ab ? static_cast<const void*>(a_codes) : w_codes;
  const void* second = p->swap_ab ? static_cast<const void*>(w_codes) : a_codes;
  RETURN_IF_ERROR(Run(p, first, second, out, stream));
  return bias == nullptr || p->fused_bias ? absl::OkStatus() : AddBias(out, bias, m, n, stream);
}

absl::StatusOr<bool> CublasLtFp8Gemm::CutlassBlockLinear(
    const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes, const float* w_scales,
    int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, const __nv_bfloat16* bias,
    cudaStream_t stream) {
#ifdef TANDEM_HAVE_CUTLASS
  // A bias: cuBLASLt's BIAS epilogue adds it before the one rounding (CUTLASS's has no bias).
  if (bias != nullptr) return false;
  const CutlassFp8BlockGemmArgs args{a_codes, a_scales, w_codes, w_scales, Block128WeightScaleLd(k),
                                     m,       n,        k,       out};
  const absl::StatusOr<size_t> needed = CutlassFp8BlockGemmWorkspaceBytes(args);
  if (!needed.ok()) return false;  // sizes CUTLASS refuses (k % 128, n % 8)
  void* workspace = workspace_;
  int64_t bytes = workspace_bytes_;
  if (static_cast<int64_t>(*needed) > bytes) {
    if (static_cast<int64_t>(*needed) > cutlass_workspace_bytes_) {
      // Grown only outside a capture; the old buffer stays allocated (a graph may use it).
      ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(stream));
      if (capturing) return false;
      void* grown = nullptr;
      if (cudaMalloc(&grown, *needed) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      if (cutlass_workspace_ != nullptr) retired_workspaces_.push_back(cutlass_workspace_);
      cutlass_workspace_ = grown;
      cutlass_workspace_bytes_ = static_cast<int64_t>(*needed);
    }
    workspace = cutlass_workspace_;
    bytes = cutlass_workspace_bytes_;
  }
  // Any refusal (pointers, alignment, CUTLASS's can_implement) leaves the call to cuBLASLt, which
  // checks the same inputs itself; last_block_kernel() tells which one ran.
  if (!CutlassFp8BlockGemm(args, workspace, static_cast<size_t>(bytes), stream).ok()) return false;
  last_block_kernel_ = Fp8BlockGemmKernel::kCutlass;
  return true;
#else
  (void)a_codes, (void)a_scales, (void)w_codes, (void)w_scales, (void)m, (void)n, (void)k;
  (void)out, (void)bias, (void)stream;
  return false;
#endif
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
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = std::min(chunk, m - r0);
    RETURN_IF_ERROR(ProductF32(a_codes + r0 * k, w_codes, rows, n, k, accumulator_, stream));
    RETURN_IF_ERROR(ScaleFp8Accumulator(accumulator_, a_scales + r0, w_scales, bias, rows, n,
                                        out + r0 * n, stream));
  }
  return absl::OkStatus();
}

absl::Status CublasLtFp8Gemm::ProductF32(const uint8_t* a_codes, const uint8_t* w_codes, int64_t m,
                                         int64_t n, int64_t k, float* out, cudaStream_t stream) {
  if (m < 0 || n < 0 || k < 16 || k % 16 != 0 || a_codes == nullptr || w_codes == nullptr ||
      out == nullptr || !Aligned16(a_codes) || !Aligned16(w_codes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CublasLtFp8Gemm::ProductF32: needs m, n >= 0, k a positive multiple of 16 and 16-byte "
        "aligned codes; got m=",
        m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Plan * p, GetPlan(PlanKey{m, n, k, kUnscaledF32Plan, false}));
  return Run(p, w_codes, a_codes, out, stream);
}

}  // namespace tandem::kernels::cuda
