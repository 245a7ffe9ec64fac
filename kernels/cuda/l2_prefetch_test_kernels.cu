#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/l2_prefetch_test_kernels.h"

namespace tandem::kernels::cuda::l2_prefetch_test {
namespace {

__global__ void CopyAfterWaitKernel(uint8_t* dst, const uint8_t* src, size_t bytes) {
  internal::WaitForPrecedingGrid();
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride) dst[i] = src[i];
}

__global__ void NoWaitKernel() { internal::AllowDependentLaunch(); }

}  // namespace

cudaError_t LaunchPdlCopyAfterWait(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  const internal::PdlLaunchConfig config(dim3(32), dim3(256), stream, /*pdl=*/true);
  return cudaLaunchKernelEx(config.get(), CopyAfterWaitKernel, static_cast<uint8_t*>(dst),
                            static_cast<const uint8_t*>(src), bytes);
}

cudaError_t LaunchPdlNoWait(cudaStream_t stream) {
  const internal::PdlLaunchConfig config(dim3(1), dim3(32), stream, /*pdl=*/true);
  return cudaLaunchKernelEx(config.get(), NoWaitKernel);
}

}  // namespace tandem::kernels::cuda::l2_prefetch_test
