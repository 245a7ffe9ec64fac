// TMA tensor maps for the CUDA kernels (internal; include from .cu only).
#ifndef TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
#define TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace tandem::kernels::cuda::internal {

// cuTensorMapEncodeTiled from the driver through the runtime (no libcuda link), looked up once;
// nullptr where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
