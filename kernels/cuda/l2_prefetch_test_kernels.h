// Test kernels for l2_prefetch_cuda_test (testonly): a PDL-launched reader that copies its
// predecessor's output after griddepcontrol.wait, and a PDL kernel that breaks the PDL contract
// (lets its dependents launch and exits without waiting for its predecessor): the control that
// shows the test would catch a prefetch kernel that did not wait.
#ifndef TANDEM_KERNELS_CUDA_L2_PREFETCH_TEST_KERNELS_H_
#define TANDEM_KERNELS_CUDA_L2_PREFETCH_TEST_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tandem::kernels::cuda::l2_prefetch_test {

// dst[0, bytes) = src[0, bytes), read after WaitForPrecedingGrid; launched with the PDL
// attribute.
cudaError_t LaunchPdlCopyAfterWait(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Allows its dependents and exits without waiting; launched with the PDL attribute.
cudaError_t LaunchPdlNoWait(cudaStream_t stream);

}  // namespace tandem::kernels::cuda::l2_prefetch_test

#endif  // TANDEM_KERNELS_CUDA_L2_PREFETCH_TEST_KERNELS_H_
