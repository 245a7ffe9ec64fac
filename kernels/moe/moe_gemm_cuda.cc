#include "kernels/moe/moe_gemm_cuda.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace tandem::kernels::cuda {

absl::StatusOr<std::unique_ptr<MoeGroupedGemm>> MoeGroupedGemm::Create(int64_t max_experts) {
  if (max_experts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MoeGroupedGemm: ", max_experts, " experts"));
  }
  std::unique_ptr<MoeGroupedGemm> g(new MoeGroupedGemm());
  g->max_experts_ = max_experts;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&g->handle_));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, kWorkspaceBytes));
  CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&g->offsets_host_), (max_experts + 1) * 4));
  for (int t = 0; t < 2; ++t) {
    const size_t bytes = 3 * max_experts * sizeof(void*);
    CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&g->host_ptrs_[t]), bytes));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&g->dev_ptrs_[t]), bytes));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&g->uploaded_[t], cudaEventDisableTiming));
  }
  return g;
}

MoeGroupedGemm::~MoeGroupedGemm() {
  for (int t = 0; t < 2; ++t) {
    if (uploaded_[t] != nullptr) cudaEventDestroy(uploaded_[t]);
    if (dev_ptrs_[t] != nullptr) cudaFree(dev_ptrs_[t]);
    if (host_ptrs_[t] != nullptr) cudaFreeHost(host_ptrs_[t]);
  }
  if (offsets_host_ != nullptr) cudaFreeHost(offsets_host_);
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

absl::Status MoeGroupedGemm::Bind(cudaStream_t stream) {
  // cublasSetStream resets the workspace to cuBLAS's pool: set ours again after it.
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream));
  CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
  return absl::OkStatus();
}

absl::Status MoeGroupedGemm::RunPadded(const void* a, const void* w, int64_t num_experts,
                                       int64_t cap, int64_t n, int64_t k, void* out, Dtype dtype,
                                       cudaStream_t stream) {
  if (num_experts < 1 || cap < 1 || n < 1 || k < 1 || n > 0x7fffffff || k > 0x7fffffff ||
      cap > 0x7fffffff || num_experts > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeGroupedGemm::RunPadded: experts ", num_experts, ", cap ", cap, ", n ", n, ", k ", k));
  }
  RETURN_IF_ERROR(Bind(stream));
  const cudaDataType_t type = dtype == Dtype::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out_e[cap, n] = a_e[cap, k] . w_e[n, k]^T, column-major as in Run().
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(cap),
      static_cast<int>(k), &alpha, w, type, static_cast<int>(k), n * k, a, type,
      static_cast<int>(k), cap * k, &beta, out, type, static_cast<int>(n), cap * n,
      static_cast<int>(num_experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status MoeGroupedGemm::Dense(const void* a, const void* w, int64_t m, int64_t n, int64_t k,
                                   void* out, Dtype dtype, cudaStream_t stream) {
  if (m < 1 || n < 1 || k < 1 || m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeGroupedGemm::Dense: m ", m, ", n ", n, ", k ", k));
  }
  RETURN_IF_ERROR(Bind(stream));
  const cudaDataType_t type = dtype == Dtype::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &alpha, w, type, static_cast<int>(k), a, type, static_cast<int>(k),
      &beta, out, type, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status MoeGroupedGemm::ReadOffsets(const int32_t* expert_offsets, int64_t num_experts,
                                         cudaStream_t stream) {
  if (num_experts < 1 || num_experts > max_experts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeGroupedGemm: ", num_experts, " experts, tables for ", max_experts_));
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets_host_, expert_offsets, (num_experts + 1) * 4,
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  offsets_.assign(offsets_host_, offsets_host_ + num_experts + 1);
  return absl::OkStatus();
}

absl::Status MoeGroupedGemm::Run(const void* a, const void* w, int64_t n, int64_t k, void* out,
                                 Dtype dtype, int table, Mode mode, cudaStream_t stream) {
  const int64_t E = static_cast<int64_t>(offsets_.size()) - 1;
  if (E < 1 || n < 1 || k < 1 || table < 0 || table > 1 || n > 0x7fffffff || k > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("MoeGroupedGemm::Run: ", E, " experts (call ",
                                                   "ReadOffsets first), n ", n, ", k ", k,
                                                   ", table ", table));
  }
  const cudaDataType_t type = dtype == Dtype::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  const int64_t es = 2;
  RETURN_IF_ERROR(Bind(stream));
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out[m, n] = a[m, k] . w[n, k]^T is column-major out^T[n, m] = w^T-view . a-view:
  // cuBLAS m = n, n = rows, op(A) = T on w (ld k), op(B) = N on a (ld k), ldc = n.
  auto a_of = [&](int64_t e) { return static_cast<const char*>(a) + offsets_[e] * k * es; };
  auto w_of = [&](int64_t e) { return static_cast<const char*>(w) + e * n * k * es; };
  auto out_of = [&](int64_t e) { return static_cast<char*>(out) + offsets_[e] * n * es; };
  if (mode == Mode::kPerExpert) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = offsets_[e + 1] - offsets_[e];
      if (m == 0) continue;
      CUBLAS_RETURN_IF_ERROR(
          cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                       static_cast<int>(k), &alpha, w_of(e), type, static_cast<int>(k), a_of(e),
                       type, static_cast<int>(k), &beta, out_of(e), type, static_cast<int>(n),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return absl::OkStatus();
  }
  // The host table is reused only once its previous upload has run.
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded_[table]));
  const void** ptrs = host_ptrs_[table];
  std::vector<int> m_arr, n_arr, k_arr, ld_k, ld_n, sizes;
  std::vector<cublasOperation_t> op_t, op_n;
  std::vector<float> alphas, betas;
  int groups = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = offsets_[e + 1] - offsets_[e];
    if (m == 0) continue;
    ptrs[groups] = w_of(e);
    ptrs[E + groups] = a_of(e);
    ptrs[2 * E + groups] = out_of(e);
    m_arr.push_back(static_cast<int>(n));
    n_arr.push_back(static_cast<int>(m));
    ++groups;
  }
  if (groups == 0) return absl::OkStatus();
  k_arr.assign(groups, static_cast<int>(k));
  ld_k.assign(groups, static_cast<int>(k));
  ld_n.assign(groups, static_cast<int>(n));
  sizes.assign(groups, 1);
  op_t.assign(groups, CUBLAS_OP_T);
  op_n.assign(groups, CUBLAS_OP_N);
  alphas.assign(groups, 1.0f);
  betas.assign(groups, 0.0f);
  void** dev = dev_ptrs_[table];
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev, ptrs, 3 * E * sizeof(void*), cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_[table], stream));
  CUBLAS_RETURN_IF_ERROR(cublasGemmGroupedBatchedEx(
      handle_, op_t.data(), op_n.data(), m_arr.data(), n_arr.data(), k_arr.data(), alphas.data(),
      reinterpret_cast<const void* const*>(dev), type, ld_k.data(),
      reinterpret_cast<const void* const*>(dev + E), type, ld_k.data(), betas.data(), dev + 2 * E,
      type, ld_n.data(), groups, sizes.data(), CUBLAS_COMPUTE_32F));
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
