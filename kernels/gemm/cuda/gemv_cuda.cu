#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane

template <typename T>
__device__ __forceinline__ float ToFloat(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

template <typename TOut>
__device__ __forceinline__ TOut FromFloat(float x) {
  if constexpr (std::is_same_v<TOut, float>) {
    return x;
  } else if constexpr (std::is_same_v<TOut, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// acc[r] += dot(8 elements of w, 8 elements of row r of a).
template <typename T, int M>
__device__ __forceinline__ void Fma8(const uint4& wv, const T* a, int64_t k, int64_t col,
                                     float (&acc)[M]) {
  const T* wt = reinterpret_cast<const T*>(&wv);
  float wf[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) wf[e] = ToFloat(wt[e]);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const uint4 av = __ldg(reinterpret_cast<const uint4*>(a + r * k + col));
    const T* at = reinterpret_cast<const T*>(&av);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], ToFloat(at[e]), acc[r]);
  }
}

// acc[r] = dot(wrow, row r of a) for one weight row (k / 8 16-byte chunks), summed over the
// warp. Each lane owns the chunks lane, lane + 32, ...; kUnroll of them (or all that are left)
// are loaded before any is used so several 16-byte reads per lane are in flight.
template <typename T, int M>
__device__ __forceinline__ void WarpDot(const uint4* __restrict__ wrow, const T* a, int64_t k,
                                        int lane, float (&acc)[M]) {
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const int64_t chunks = k / 8;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Fma8<T, M>(wv[u], a, k, (c + 32 * u) * 8, acc);
  }
  // The rest (fewer than kUnroll chunks a lane) is loaded together too, predicated, and added in
  // the same order: the narrow tensor-parallel shapes (o_proj's k = 1024 at TP=4: 4 chunks a
  // lane, none in the loop above) no longer wait for one 16-byte load at a time.
  if (c < chunks) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + 32 * u < chunks) wv[u] = __ldcs(wrow + c + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + 32 * u < chunks) Fma8<T, M>(wv[u], a, k, (c + 32 * u) * 8, acc);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
}

// kRows = 1: plain linear, warp = output row `row`. kRows = 2: SiLU-and-mul, warp = output
// column `row` of [m, n]: the gate row `row`, then the up row n + `row`, each streamed exactly
// as the plain kernel streams a row (same loads in flight, same lane order of accumulation, so
// the gate and up values are bit-identical to the plain kernel's).
template <typename T, typename TOut, int M, int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SmallMLinearKernel(const T* __restrict__ a, const T* __restrict__ w, const T* __restrict__ bias,
                       int64_t n, int64_t k, TOut* __restrict__ out) {
  static_assert(kRows == 1 || (kRows == 2 && std::is_same_v<T, TOut>));
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const bool active = row < n;
  const uint4* wrow[kRows];
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    wrow[q] = reinterpret_cast<const uint4*>(w + (active ? row + q * n : 0) * k);
  }
  // Nothing before the wait: prefetching this warp's first weight chunks into L2 there (they
  // never depend on the predecessor) made the H200 Llama-3-8B batch-1 step ~7% slower under PDL
  // (4.60 -> 4.98 ms), so the kernel only waits, and gains the predecessor's launch latency.
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!active) return;
  float acc[kRows][M];
#pragma unroll
  for (int q = 0; q < kRows; ++q) WarpDot<T, M>(wrow[q], a, k, lane, acc[q]);
  if (lane != 0) return;
  if constexpr (kRows == 1) {
    const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) out[r * n + row] = FromFloat<TOut>(acc[0][r] + b);
  } else {
    const float bg = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
    const float bu = bias != nullptr ? ToFloat(bias[n + row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      // Round gate and up to T first, as the unfused path stores them, then SiluAndMul's
      // expression verbatim (expf, not __expf), so the result is bit-identical.
      const float g = ToFloat(FromFloat<T>(acc[0][r] + bg));
      const float u = ToFloat(FromFloat<T>(acc[1][r] + bu));
      out[r * n + row] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
    }
  }
}

template <typename T, typename TOut, int M, int kRows>
cudaError_t Launch(const T* a, const T* w, const T* bias, int64_t n, int64_t k, TOut* out,
                   cudaStream_t stream, bool programmatic_launch) {
  const internal::PdlLaunchConfig config(
      dim3(static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock)),
      dim3(kWarpsPerBlock * 32), stream, programmatic_launch);
  return cudaLaunchKernelEx(config.get(), SmallMLinearKernel<T, TOut, M, kRows>, a, w, bias, n, k,
                            out);
}

// The one place where m becomes a template constant.
template <typename T, typename TOut, int kRows>
cudaError_t Dispatch(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                     TOut* out, cudaStream_t stream, bool pdl) {
  switch (m) {
    case 1:
      return Launch<T, TOut, 1, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 2:
      return Launch<T, TOut, 2, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 3:
      return Launch<T, TOut, 3, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 4:
      return Launch<T, TOut, 4, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 5:
      return Launch<T, TOut, 5, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 6:
      return Launch<T, TOut, 6, kRows>(a, w, bias, n, k, out, stream, pdl);
    case 7:
      return Launch<T, TOut, 7, kRows>(a, w, bias, n, k, out, stream, pdl);
    default:
      return Launch<T, TOut, 8, kRows>(a, w, bias, n, k, out, stream, pdl);
  }
}

}  // namespace

bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && a != nullptr &&
         w != nullptr && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && n <= (int64_t{1} << 31) * kWarpsPerBlock;
}

template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream, bool programmatic_launch) {
  if (!SmallMLinearSupported(a, w, m, n, k) || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("SmallMLinear: needs 1 <= m <= ", kGemvMaxM,
                                                   ", n >= 1, k a positive multiple of 8, "
                                                   "16-byte aligned a/w and non-null out; got m=",
                                                   m, " n=", n, " k=", k));
  }
  CUDA_RETURN_IF_ERROR(
      (Dispatch<T, TOut, 1>(a, w, bias, m, n, k, out, stream, programmatic_launch)));
  return absl::OkStatus();
}

template <typename T>
absl::Status SmallMLinearSiluMul(const T* a, const T* w, const T* bias, int64_t m, int64_t inter,
                                 int64_t k, T* out, cudaStream_t stream, bool programmatic_launch) {
  if (inter < 1 || !SmallMLinearSupported(a, w, m, 2 * inter, k) || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SmallMLinearSiluMul: needs 1 <= m <= ", kGemvMaxM,
                     ", inter >= 1, k a positive multiple of 8, 16-byte aligned a/w and non-null "
                     "out; got m=",
                     m, " inter=", inter, " k=", k));
  }
  CUDA_RETURN_IF_ERROR(
      (Dispatch<T, T, 2>(a, w, bias, m, inter, k, out, stream, programmatic_launch)));
  return absl::OkStatus();
}

#define TANDEM_GEMV_CUDA_INSTANTIATE(T, TOut)                                                 \
  template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t, int64_t, \
                                              int64_t, TOut*, cudaStream_t, bool);
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, __half)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, float)
#undef TANDEM_GEMV_CUDA_INSTANTIATE
template absl::Status SmallMLinearSiluMul<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, int64_t, int64_t,
                                                         int64_t, __nv_bfloat16*, cudaStream_t,
                                                         bool);
template absl::Status SmallMLinearSiluMul<__half>(const __half*, const __half*, const __half*,
                                                  int64_t, int64_t, int64_t, __half*, cudaStream_t,
                                                  bool);

}  // namespace tandem::kernels::cuda
