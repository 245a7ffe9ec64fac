// Owned, untyped CUDA allocations for the CUDA backend: DeviceBuffer (cudaMalloc / cudaFree) and
// PinnedBuffer (cudaHostAlloc / cudaFreeHost, for asynchronous copies). Move-only.
//
// Thread safety: plain value types; not synchronized.
#ifndef TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_
#define TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

namespace tandem::runtime::cuda {

namespace internal {
struct DeviceMemory {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void Free(void* p) { cudaFree(p); }
  static constexpr const char* kCall = "cudaMalloc";
};
struct PinnedMemory {
  static cudaError_t Alloc(void** p, size_t bytes) {
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
  }
  static void Free(void* p) { cudaFreeHost(p); }
  static constexpr const char* kCall = "cudaHostAlloc";
};
// The failed allocation as a Status naming `what`, `bytes` and the CUDA error (and clearing it).
absl::Status AllocationError(cudaError_t err, const char* call, int64_t bytes, const char* what);
absl::Status NegativeSizeError(int64_t bytes, const char* what);
}  // namespace internal

template <typename Memory>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  // RESOURCE_EXHAUSTED (naming `what` and the size) when out of memory, INVALID_ARGUMENT for a
  // negative size; 0 bytes: an empty buffer.
  static absl::StatusOr<CudaBuffer> Allocate(int64_t bytes, const char* what) {
    CudaBuffer buffer;
    if (bytes < 0) return internal::NegativeSizeError(bytes, what);
    if (bytes == 0) return buffer;
    const cudaError_t err = Memory::Alloc(&buffer.ptr_, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      buffer.ptr_ = nullptr;
      return internal::AllocationError(err, Memory::kCall, bytes, what);
    }
    buffer.bytes_ = bytes;
    return buffer;
  }
  CudaBuffer(CudaBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { Reset(); }

  void Reset() {
    if (ptr_ != nullptr) Memory::Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return ptr_; }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

using DeviceBuffer = CudaBuffer<internal::DeviceMemory>;
using PinnedBuffer = CudaBuffer<internal::PinnedMemory>;

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_
