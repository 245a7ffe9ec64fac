#include "common/cublas_status.h"

#include <cublas_api.h>

namespace tandem {
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
  return LibraryError(CublasStatusCode(status), "cuBLAS", cublasGetStatusName(status),
                      cublasGetStatusString(status), site);
}

}  // namespace tandem
