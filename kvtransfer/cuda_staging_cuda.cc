// CUDA build of cuda_staging.h.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kvtransfer/cuda_staging.h"

namespace tandem::kvtransfer {
namespace {

// Makes `device` current for the scope and restores the caller's device afterwards, so helper
// calls never change which device the calling thread works on.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = CudaStatus(cudaSetDevice(device), {"cudaSetDevice", __FILE__, __LINE__});
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace

bool CudaStagingCompiled() { return true; }

absl::StatusOr<void*> CudaDeviceAlloc(uint64_t bytes, int device) {
  DeviceScope scope(device);
  RETURN_IF_ERROR(scope.status());
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return p;
}

void CudaDeviceFree(void* device_ptr) {
  if (device_ptr != nullptr) cudaFree(device_ptr);
}

absl::Status CudaCopy(void* dst, const void* src, uint64_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDeviceOf(const void* ptr) {
  cudaPointerAttributes attr{};
  CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, ptr));
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("pointer ", reinterpret_cast<uintptr_t>(ptr), " is not CUDA device memory"));
  }
  return attr.device;
}

absl::StatusOr<void*> CudaPinnedAlloc(uint64_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void CudaPinnedFree(void* host_ptr) {
  if (host_ptr != nullptr) cudaFreeHost(host_ptr);
}

absl::Status CudaPinHostMemory(void* host_ptr, uint64_t bytes) {
  if (cudaHostRegister(host_ptr, bytes, cudaHostRegisterPortable) == cudaSuccess) {
    return absl::OkStatus();
  }
  cudaGetLastError();  // clear it: a read-only mapping (another process's segment) may still work
  CUDA_RETURN_IF_ERROR(
      cudaHostRegister(host_ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly));
  return absl::OkStatus();
}

void CudaUnpinHostMemory(void* host_ptr) {
  if (host_ptr != nullptr) cudaHostUnregister(host_ptr);
}

absl::StatusOr<std::unique_ptr<CudaCopyStream>> CudaCopyStream::Create(int device, int num_slots) {
  DeviceScope scope(device);
  RETURN_IF_ERROR(scope.status());
  std::unique_ptr<CudaCopyStream> s(new CudaCopyStream(device));
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  s->stream_ = stream;
  for (int i = 0; i < num_slots; ++i) {
    cudaEvent_t event = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    s->events_.push_back(event);
  }
  return s;
}

CudaCopyStream::~CudaCopyStream() {
  DeviceScope scope(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status CudaCopyStream::CopyAsync(void* dst, const void* src, uint64_t n, int slot) {
  DeviceScope scope(device_);
  RETURN_IF_ERROR(scope.status());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(slot)), stream));
  return absl::OkStatus();
}

absl::Status CudaCopyStream::Copy2DAsync(void* dst, uint64_t dst_pitch, const void* src,
                                         uint64_t src_pitch, uint64_t row_bytes, uint64_t rows,
                                         int slot) {
  DeviceScope scope(device_);
  RETURN_IF_ERROR(scope.status());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                         cudaMemcpyDefault, stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(slot)), stream));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaCopyStream::SlotDone(int slot) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(events_.at(slot)));
  if (e == cudaErrorNotReady) return false;
  CUDA_RETURN_IF_ERROR(e);
  return true;
}

absl::Status CudaCopyStream::Synchronize() {
  DeviceScope scope(device_);
  RETURN_IF_ERROR(scope.status());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
