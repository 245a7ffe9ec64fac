#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl_test_util.h"

namespace tandem::kernels::cuda::pdl_test {
namespace {

__device__ void CopyBytes(const CopyRegion& r) {
  auto* dst = static_cast<uint8_t*>(r.dst);
  const auto* src = static_cast<const uint8_t*>(r.src);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < r.bytes; i += stride) dst[i] = src[i];
}

__global__ void DelayedWriterKernel(CopyRegion a, CopyRegion b, long long spin_cycles) {
  internal::AllowDependentLaunch();
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  CopyBytes(a);
  CopyBytes(b);
}

}  // namespace

cudaError_t LaunchDelayedWriter(CopyRegion a, CopyRegion b, long long spin_cycles,
                                cudaStream_t stream) {
  // 16 blocks: a few SMs stay busy while the dependent grid's other CTAs start beside them.
  DelayedWriterKernel<<<16, 256, 0, stream>>>(a, b, spin_cycles);
  return cudaGetLastError();
}

}  // namespace tandem::kernels::cuda::pdl_test
