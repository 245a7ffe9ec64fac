// cuBLAS / cuBLASLt error -> absl::Status conversion (CUDA builds only).
//
//   CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(...));
//
// Codes: alloc failed -> RESOURCE_EXHAUSTED; invalid value -> INVALID_ARGUMENT; not supported
// / arch mismatch -> UNIMPLEMENTED; not initialized -> FAILED_PRECONDITION; else INTERNAL.
#ifndef TANDEM_COMMON_CUBLAS_STATUS_H_
#define TANDEM_COMMON_CUBLAS_STATUS_H_

#include <cublas_api.h>

#include "absl/status/status.h"
#include "common/error_status.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusCode CublasStatusCode(cublasStatus_t status);
absl::Status CublasStatus(cublasStatus_t status, const CallSite& site);

}  // namespace tandem

#define CUBLAS_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::CublasStatus((expr), {#expr, __FILE__, __LINE__}))

#endif  // TANDEM_COMMON_CUBLAS_STATUS_H_
