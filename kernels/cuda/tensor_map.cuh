// TMA tensor maps for the CUDA kernels and the 2-d TMA load / expect-tx device helpers (internal;
// include from .cu only).
#ifndef TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
#define TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

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

// One arrival on the mbarrier `bar` that also expects `bytes` more transaction bytes (a TMA's).
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

// TMA: the box at (inner coordinate col, outer coordinate row) of the 2-d tensor map into shared
// memory at dst, completing its bytes on the mbarrier `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int col, int row,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(SmemAddr(bar))
      : "memory");
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
