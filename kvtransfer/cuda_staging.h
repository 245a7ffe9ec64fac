// The CUDA runtime calls UcxAgent needs to stage GPU memory through pinned host buffers (UCX
// without CUDA transports, see ucx_agent.h), plus device-memory helpers for tests, the
// agent_peer harness and the benchmark. CUDA types stay out of this header so CPU-only code
// compiles against it: CUDA builds link cuda_staging_cuda.cc, CPU-only builds
// cuda_staging_cpu.cc, where every call returns UNIMPLEMENTED and CudaStagingCompiled() is false.
//
// Thread safety: the free functions are thread-safe; a CudaCopyStream is used by one thread
// at a time (UcxAgent calls it under its mutex).
#ifndef TANDEM_KVTRANSFER_CUDA_STAGING_H_
#define TANDEM_KVTRANSFER_CUDA_STAGING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer {

// Whether this build has the CUDA implementation.
bool CudaStagingCompiled();

// Device memory (cudaMalloc on `device`) and synchronous copies in any direction
// (cudaMemcpyDefault: host, device and pinned pointers all work).
absl::StatusOr<void*> CudaDeviceAlloc(uint64_t bytes, int device = 0);
void CudaDeviceFree(void* device_ptr);
absl::Status CudaCopy(void* dst, const void* src, uint64_t bytes);
// The device that owns `ptr`; INVALID_ARGUMENT when it is not device memory.
absl::StatusOr<int> CudaDeviceOf(const void* ptr);

// Pinned host memory: cudaHostAlloc'd, or existing memory page-locked with cudaHostRegister
// (read-only mappings are registered read-only: the GPU may then only read them).
absl::StatusOr<void*> CudaPinnedAlloc(uint64_t bytes);
void CudaPinnedFree(void* host_ptr);
absl::Status CudaPinHostMemory(void* host_ptr, uint64_t bytes);
void CudaUnpinHostMemory(void* host_ptr);

// One CUDA stream on one device plus `num_slots` events: asynchronous copies whose completion
// is polled per slot (UcxAgent: one slot per staging buffer).
class CudaCopyStream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaCopyStream>> Create(int device, int num_slots);
  ~CudaCopyStream();  // waits for outstanding copies
  CudaCopyStream(const CudaCopyStream&) = delete;
  CudaCopyStream& operator=(const CudaCopyStream&) = delete;

  int device() const { return device_; }
  // Enqueues dst <- src (n bytes) and records slot's event after it.
  absl::Status CopyAsync(void* dst, const void* src, uint64_t n, int slot);
  // Enqueues `rows` rows of `row_bytes`, row i from src + i * src_pitch to dst + i * dst_pitch
  // (one cudaMemcpy2DAsync: the copy engine re-strides them), and records slot's event after.
  absl::Status Copy2DAsync(void* dst, uint64_t dst_pitch, const void* src, uint64_t src_pitch,
                           uint64_t row_bytes, uint64_t rows, int slot);
  // true once every copy enqueued for `slot` has finished; an error when one failed.
  absl::StatusOr<bool> SlotDone(int slot);
  absl::Status Synchronize();

 private:
  explicit CudaCopyStream(int device) : device_(device) {}
  int device_;
  void* stream_ = nullptr;     // cudaStream_t
  std::vector<void*> events_;  // cudaEvent_t per slot
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_CUDA_STAGING_H_
