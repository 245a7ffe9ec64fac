// The e4m3 tensor-core MMA shared by the FP8 GEMV (kernels/fp8) and the FP8 MoE grouped MMA
// (kernels/moe) (internal; include from .cu only).
#ifndef TANDEM_KERNELS_CUDA_MMA_E4M3_CUH_
#define TANDEM_KERNELS_CUDA_MMA_E4M3_CUH_

#include <cstdint>

namespace tandem::kernels::cuda::internal {

// c (16 x 8, fp32) += a (16 x 32 e4m3, row) * b (32 x 8 e4m3, col). sm_89+ (the build targets
// sm_90a and compute_90).
__device__ __forceinline__ void MmaE4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_MMA_E4M3_CUH_
