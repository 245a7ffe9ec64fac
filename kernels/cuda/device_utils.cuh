// Device helpers shared by the CUDA kernels of this package (internal; include from .cu only).
#ifndef TANDEM_KERNELS_CUDA_DEVICE_UTILS_CUH_
#define TANDEM_KERNELS_CUDA_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

namespace tandem::kernels::cuda::internal {

// Element <-> fp32 conversion for the activation and KV types.
template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_fp8_e4m3>(__nv_fp8_e4m3 x) {
  return static_cast<float>(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 FromFloat<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);  // round to nearest, saturating to +-448
}

// N elements of T as one aligned vector, for 16-byte (or smaller) global/shared accesses.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Converts N packed elements to fp32. bf16 -> fp32 is a shift, done on 32-bit pairs so the
// compiler emits two integer ops per pair.
template <typename T, int N>
__device__ __forceinline__ void VecToFloat(const Vec<T, N>& in, float* out) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = ToFloat(in.v[i]);
}
template <int N>
__device__ __forceinline__ void VecToFloat(const Vec<__nv_bfloat16, N>& in, float* out) {
  static_assert(N % 2 == 0);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(in.v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// fp8 e4m3 -> fp32 two at a time through the hardware fp8x2 -> half2 conversion (exact: every
// e4m3 value is a half).
template <int N>
__device__ __forceinline__ void VecToFloat(const Vec<__nv_fp8_e4m3, N>& in, float* out) {
  static_assert(N % 2 == 0);
  const __nv_fp8x2_storage_t* w = reinterpret_cast<const __nv_fp8x2_storage_t*>(in.v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(w[i], __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> FloatToVec(const float* in) {
  Vec<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.v[i] = FromFloat<T>(in[i]);
  return out;
}

// cp.async of 16 bytes global -> shared; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared-memory address of a generic pointer, for PTX operands.
__device__ __forceinline__ uint32_t SmemAddr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ldmatrix: four 8x8 b16 tiles from shared memory (transposed for the Trans form).
__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulators; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void Mma16816(float* c, const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Programmatic dependent launch (PDL). A kernel launched through PdlLaunchConfig with pdl = true
// may start while its predecessor in the stream still runs: it must call WaitForPrecedingGrid()
// before touching anything the predecessor writes (griddepcontrol.wait returns once that grid
// has completed and its memory is visible), and may call AllowDependentLaunch() to let its own
// successor be scheduled early. Both are no-ops in a grid launched without the attribute.
__device__ __forceinline__ void WaitForPrecedingGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A cudaLaunchKernelEx configuration (`smem_bytes` of dynamic shared memory) with programmatic
// stream serialization when `pdl`. Not copyable: the config points at its own attribute array.
class PdlLaunchConfig {
 public:
  PdlLaunchConfig(dim3 grid, dim3 block, cudaStream_t stream, bool pdl, size_t smem_bytes = 0) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = smem_bytes;
    config_.stream = stream;
    attr_[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr_[0].val.programmaticStreamSerializationAllowed = 1;
    config_.attrs = attr_;
    config_.numAttrs = pdl ? 1 : 0;
  }
  PdlLaunchConfig(const PdlLaunchConfig&) = delete;
  PdlLaunchConfig& operator=(const PdlLaunchConfig&) = delete;
  const cudaLaunchConfig_t* get() const { return &config_; }

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attr_[1] = {};
};

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_DEVICE_UTILS_CUH_
