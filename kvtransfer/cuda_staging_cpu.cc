// CPU-only build of cuda_staging.h: no CUDA runtime, every call is UNIMPLEMENTED.
#include "kvtransfer/cuda_staging.h"

namespace tandem::kvtransfer {
namespace {

absl::Status NoCuda() { return absl::UnimplementedError("built without CUDA"); }

}  // namespace

bool CudaStagingCompiled() { return false; }
absl::StatusOr<void*> CudaDeviceAlloc(uint64_t /*bytes*/, int /*device*/) { return NoCuda(); }
void CudaDeviceFree(void* /*device_ptr*/) {}
absl::Status CudaCopy(void* /*dst*/, const void* /*src*/, uint64_t /*bytes*/) { return NoCuda(); }
absl::StatusOr<int> CudaDeviceOf(const void* /*ptr*/) { return NoCuda(); }
absl::StatusOr<void*> CudaPinnedAlloc(uint64_t /*bytes*/) { return NoCuda(); }
void CudaPinnedFree(void* /*host_ptr*/) {}
absl::Status CudaPinHostMemory(void* /*host_ptr*/, uint64_t /*bytes*/) { return NoCuda(); }
void CudaUnpinHostMemory(void* /*host_ptr*/) {}

absl::StatusOr<std::unique_ptr<CudaCopyStream>> CudaCopyStream::Create(int /*device*/,
                                                                       int /*num_slots*/) {
  return NoCuda();
}
CudaCopyStream::~CudaCopyStream() = default;
absl::Status CudaCopyStream::CopyAsync(void* /*dst*/, const void* /*src*/, uint64_t /*n*/,
                                       int /*slot*/) {
  return NoCuda();
}
absl::Status CudaCopyStream::Copy2DAsync(void* /*dst*/, uint64_t /*dst_pitch*/, const void* /*src*/,
                                         uint64_t /*src_pitch*/, uint64_t /*row_bytes*/,
                                         uint64_t /*rows*/, int /*slot*/) {
  return NoCuda();
}
absl::StatusOr<bool> CudaCopyStream::SlotDone(int /*slot*/) { return NoCuda(); }
absl::Status CudaCopyStream::Synchronize() { return NoCuda(); }

}  // namespace tandem::kvtransfer
