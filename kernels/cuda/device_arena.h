// DeviceArena: device allocations freed together when the arena goes (the benchmarks' scratch:
// pools, metadata, workspaces). Not thread-safe; errors as absl::Status.
#ifndef TANDEM_KERNELS_CUDA_DEVICE_ARENA_H_
#define TANDEM_KERNELS_CUDA_DEVICE_ARENA_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda_status.h"

namespace tandem::kernels::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }

  // *out = `count` (at least 1) uninitialized elements of T, owned by the arena.
  template <typename T>
  absl::Status Alloc(int64_t count, T** out) {
    void* p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<int64_t>(count, 1) * sizeof(T)));
    ptrs_.push_back(p);
    *out = static_cast<T*>(p);
    return absl::OkStatus();
  }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_DEVICE_ARENA_H_
