#include "runtime/cuda/device_buffer.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"

namespace tandem::runtime::cuda {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes, const char* what) {
  DeviceBuffer buffer;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size"));
  if (bytes == 0) return buffer;
  const cudaError_t err = cudaMalloc(&buffer.ptr_, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    buffer.ptr_ = nullptr;
    return absl::Status(CudaStatusCode(err), absl::StrCat("cudaMalloc of ", bytes, " bytes for ",
                                                          what, ": ", cudaGetErrorString(err)));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(int64_t bytes, const char* what) {
  PinnedBuffer buffer;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size"));
  if (bytes == 0) return buffer;
  const cudaError_t err =
      cudaHostAlloc(&buffer.ptr_, static_cast<size_t>(bytes), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    buffer.ptr_ = nullptr;
    return absl::Status(CudaStatusCode(err), absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ",
                                                          what, ": ", cudaGetErrorString(err)));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem::runtime::cuda
