#include "common/cuda_status.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusCode CudaStatusCode(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidSymbol:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    case cudaErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CudaStatus(cudaError_t err, const CallSite& site) {
  if (err == cudaSuccess) return absl::OkStatus();
  return LibraryError(CudaStatusCode(err), "CUDA", cudaGetErrorName(err),
                      cudaGetErrorString(err), site);
}

absl::StatusCode CublasStatusCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return absl::StatusCode::kOk;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::StatusCode::kUnimplemented;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CublasStatus(cublasStatus_t status, const CallSite& site) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return LibraryError(CublasStatusCode(status), "cuBLAS",
                      cublasGetStatusName(status),
                      cublasGetStatusString(status), site);
}

absl::StatusCode NcclStatusCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
    case ncclInProgress:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclStatus(ncclResult_t result, const CallSite& site) {
  if (result == ncclSuccess) return absl::OkStatus();
  return LibraryError(NcclStatusCode(result), "NCCL",
                      absl::StrCat("ncclResult_t ", static_cast<int>(result)),
                      ncclGetErrorString(result), site);
}

}  // namespace tandem
