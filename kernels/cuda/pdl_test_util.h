// A predecessor for programmatic-dependent-launch (PDL) tests: a kernel that allows its
// dependents to launch at its first instruction, spins for a while, and only then writes its
// outputs. A PDL-launched kernel behind it that reads those outputs before its
// griddepcontrol.wait (WaitForPrecedingGrid) sees stale data; one that waits sees the new data.
#ifndef TANDEM_KERNELS_CUDA_PDL_TEST_UTIL_H_
#define TANDEM_KERNELS_CUDA_PDL_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tandem::kernels::cuda::pdl_test {

// One region the writer copies: bytes from src to dst (device pointers, 16-byte aligned sizes
// and addresses not required).
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// Launches the writer on `stream` (a plain launch): every thread allows dependents at once,
// waits ~`spin_cycles` SM clocks, then the grid copies `a` and `b` (b may be empty).
cudaError_t LaunchDelayedWriter(CopyRegion a, CopyRegion b, long long spin_cycles,
                                cudaStream_t stream);

}  // namespace tandem::kernels::cuda::pdl_test

#endif  // TANDEM_KERNELS_CUDA_PDL_TEST_UTIL_H_
