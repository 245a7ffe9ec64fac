// CUDA runtime error -> absl::Status conversion (CUDA builds only).
//
//   CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
//   CUDA_RETURN_IF_ERROR(cudaGetLastError());          // after every kernel launch
//
// Messages name file:line, the error's name and description, and the failing call.
// Codes: out of memory -> RESOURCE_EXHAUSTED; invalid value/config/pitch/symbol/device
// function -> INVALID_ARGUMENT; no device / driver too old / devices unavailable / not ready
// -> UNAVAILABLE; not supported -> UNIMPLEMENTED; anything else -> INTERNAL.
#ifndef TANDEM_COMMON_CUDA_STATUS_H_
#define TANDEM_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/error_status.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusCode CudaStatusCode(cudaError_t err);
absl::Status CudaStatus(cudaError_t err, const CallSite& site);

}  // namespace tandem

#define CUDA_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::CudaStatus((expr), {#expr, __FILE__, __LINE__}))

#endif  // TANDEM_COMMON_CUDA_STATUS_H_
