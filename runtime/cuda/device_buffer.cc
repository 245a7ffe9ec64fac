#include "runtime/cuda/device_buffer.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"

namespace tandem::runtime::cuda::internal {

absl::Status AllocationError(cudaError_t err, const char* call, int64_t bytes, const char* what) {
  cudaGetLastError();  // clear the error so later calls are unaffected
  return absl::Status(CudaStatusCode(err), absl::StrCat(call, " of ", bytes, " bytes for ", what,
                                                        ": ", cudaGetErrorString(err)));
}

absl::Status NegativeSizeError(int64_t bytes, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes for ", what));
}

}  // namespace tandem::runtime::cuda::internal
