// Hopper (sm_90a) warpgroup MMA wrappers for the prefill kernel (internal; included by
// prefill_wgmma_kernel.cuh only). Only the shapes the kernel issues: m64n128k16 with both
// operands in shared memory (S = Q K^T) and m64n{64,128}k16 with A in registers and B
// N-major in shared memory (O += P V), fp32 accumulators, bf16 or fp16 inputs.
//
// Shared-memory operands use the 128-byte swizzle: a [rows][64] block of 2-byte elements
// keeps row r's 16-byte unit u at unit u ^ (r & 7), blocks 1024-byte aligned, wider rows split
// into such 64-column blocks. Descriptor (PTX "matrix descriptor"): start address >> 4 in bits
// 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle mode 1
// (128 B) in bits 62-63. K-major (Q, K): stride = 1024 (between 8-row groups), leading unused;
// a k16 step inside a block advances the start by 32 bytes. N-major (V read as [key][dim]):
// leading = the stride between 64-column blocks, stride = 1024 (between 8-key groups).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace tandem::kernels::cuda::internal::prefill {

__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) |
         (static_cast<uint64_t>((leading >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((stride >> 4) & 0x3fff) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of registers an in-flight wgmma reads or writes
// across the issue / wait points.
__device__ __forceinline__ void FenceOperand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void FenceOperand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
// Orders shared memory written through the generic proxy (cp.async) before wgmma reads it.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// clang-format off
#define TANDEM_WGMMA_REGS64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TANDEM_WGMMA_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TANDEM_WGMMA_D4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define TANDEM_WGMMA_D16(b) \
  TANDEM_WGMMA_D4(b), TANDEM_WGMMA_D4(b + 4), TANDEM_WGMMA_D4(b + 8), TANDEM_WGMMA_D4(b + 12)
#define TANDEM_WGMMA_D32(b) TANDEM_WGMMA_D16(b), TANDEM_WGMMA_D16(b + 16)
#define TANDEM_WGMMA_D64 TANDEM_WGMMA_D32(0), TANDEM_WGMMA_D32(32)

// d (64 x 128, fp32) = (scale_d ? d : 0) + A (64 x 16, K-major smem) * B (16 x 128, K-major smem).
template <typename T>
__device__ __forceinline__ void WgmmaSS128(float* d, uint64_t desc_a, uint64_t desc_b,
                                           uint32_t scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TANDEM_WGMMA_REGS64 "}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : TANDEM_WGMMA_D64
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" TANDEM_WGMMA_REGS64 "}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : TANDEM_WGMMA_D64
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
}

// d (64 x N, fp32) += A (64 x 16, registers: the m16n8k16 A layout per warp) * B (16 x N,
// N-major smem). N = 128 or 64.
template <typename T, int N>
__device__ __forceinline__ void WgmmaRS(float* d, const uint32_t (&a)[4], uint64_t desc_b) {
  const uint32_t one = 1;
  if constexpr (N == 128 && std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TANDEM_WGMMA_REGS64 "}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : TANDEM_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(one));
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" TANDEM_WGMMA_REGS64 "}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : TANDEM_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(one));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    static_assert(N == 64);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" TANDEM_WGMMA_REGS32 "}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : TANDEM_WGMMA_D32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(one));
  } else {
    static_assert(N == 64);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" TANDEM_WGMMA_REGS32 "}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : TANDEM_WGMMA_D32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(one));
  }
}

#undef TANDEM_WGMMA_D64
#undef TANDEM_WGMMA_D32
#undef TANDEM_WGMMA_D16
#undef TANDEM_WGMMA_D4
#undef TANDEM_WGMMA_REGS32
#undef TANDEM_WGMMA_REGS64
// clang-format on

}  // namespace tandem::kernels::cuda::internal::prefill

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_CUH_
