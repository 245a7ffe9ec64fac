// An owned, untyped device allocation (cudaMalloc / cudaFree): the CUDA backend's buffers.
//
// Thread safety: plain value type; not synchronized.
#ifndef TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_
#define TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

namespace tandem::runtime::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // RESOURCE_EXHAUSTED (naming `what` and the size) when the device is out of memory.
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const char* what);
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void Reset();
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

// Pinned host memory (cudaHostAlloc / cudaFreeHost) for asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(int64_t bytes, const char* what);
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  void Reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DEVICE_BUFFER_H_
