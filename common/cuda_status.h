// CUDA runtime, cuBLAS and NCCL error -> absl::Status conversion (CUDA builds only).
//
//   CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
//   CUDA_RETURN_IF_ERROR(cudaGetLastError());          // after every kernel launch
//   CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(...));
//   NCCL_RETURN_IF_ERROR(ncclAllReduce(...));
//
// Messages name file:line, the library's error name and description, and the failing call.
// Code mapping (the rest -> INTERNAL):
//   CUDA:   out of memory -> RESOURCE_EXHAUSTED; invalid value/config/pitch/symbol/device
//           function -> INVALID_ARGUMENT; no device / driver too old / device unavailable ->
//           UNAVAILABLE; not supported -> UNIMPLEMENTED; not ready -> UNAVAILABLE (retry).
//   cuBLAS: alloc failed -> RESOURCE_EXHAUSTED; invalid value -> INVALID_ARGUMENT; not
//           supported / arch mismatch -> UNIMPLEMENTED; not initialized -> FAILED_PRECONDITION.
//   NCCL:   invalid argument/usage -> INVALID_ARGUMENT; system/remote error -> UNAVAILABLE;
//           in progress -> UNAVAILABLE (retry).
#ifndef TANDEM_COMMON_CUDA_STATUS_H_
#define TANDEM_COMMON_CUDA_STATUS_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "common/error_status.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusCode CudaStatusCode(cudaError_t err);
absl::Status CudaStatus(cudaError_t err, const CallSite& site);

absl::StatusCode CublasStatusCode(cublasStatus_t status);
absl::Status CublasStatus(cublasStatus_t status, const CallSite& site);

absl::StatusCode NcclStatusCode(ncclResult_t result);
absl::Status NcclStatus(ncclResult_t result, const CallSite& site);

}  // namespace tandem

#define CUDA_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::CudaStatus((expr), {#expr, __FILE__, __LINE__}))
#define CUBLAS_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::CublasStatus((expr), {#expr, __FILE__, __LINE__}))
#define NCCL_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::NcclStatus((expr), {#expr, __FILE__, __LINE__}))

#endif  // TANDEM_COMMON_CUDA_STATUS_H_
