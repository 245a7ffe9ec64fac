#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/gemv_cuda.h"

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

template <typename T, typename TOut, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SmallMLinearKernel(const T* __restrict__ a, const T* __restrict__ w, const T* __restrict__ bias,
                       int64_t n, int64_t k, TOut* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  const T* wrow = w + row * k;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  // Each lane owns 8-element chunks lane, lane + 32, ...; kUnroll of them are loaded before any
  // is used so several 16-byte reads per lane are in flight.
  const int64_t chunks = k / 8;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + (c + 32 * u) * 8));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Fma8<T, M>(wv[u], a, k, (c + 32 * u) * 8, acc);
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = __ldcs(reinterpret_cast<const uint4*>(wrow + c * 8));
    Fma8<T, M>(wv, a, k, c * 8, acc);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if (lane == 0) {
    const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) out[r * n + row] = FromFloat<TOut>(acc[r] + b);
  }
}

template <typename T, typename TOut, int M>
void Launch(const T* a, const T* w, const T* bias, int64_t n, int64_t k, TOut* out,
            cudaStream_t stream) {
  const int64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  SmallMLinearKernel<T, TOut, M>
      <<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(a, w, bias, n, k, out);
}

}  // namespace

bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && a != nullptr &&
         w != nullptr && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && n <= (int64_t{1} << 31) * kWarpsPerBlock;
}

template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream) {
  if (!SmallMLinearSupported(a, w, m, n, k) || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("SmallMLinear: needs 1 <= m <= ", kGemvMaxM,
                                                   ", n >= 1, k a positive multiple of 8, "
                                                   "16-byte aligned a/w and non-null out; got m=",
                                                   m, " n=", n, " k=", k));
  }
  switch (m) {
    case 1:
      Launch<T, TOut, 1>(a, w, bias, n, k, out, stream);
      break;
    case 2:
      Launch<T, TOut, 2>(a, w, bias, n, k, out, stream);
      break;
    case 3:
      Launch<T, TOut, 3>(a, w, bias, n, k, out, stream);
      break;
    case 4:
      Launch<T, TOut, 4>(a, w, bias, n, k, out, stream);
      break;
    case 5:
      Launch<T, TOut, 5>(a, w, bias, n, k, out, stream);
      break;
    case 6:
      Launch<T, TOut, 6>(a, w, bias, n, k, out, stream);
      break;
    case 7:
      Launch<T, TOut, 7>(a, w, bias, n, k, out, stream);
      break;
    default:
      Launch<T, TOut, 8>(a, w, bias, n, k, out, stream);
      break;
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status SmallMLinear<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*,
                                                                 const __nv_bfloat16*,
                                                                 const __nv_bfloat16*, int64_t,
                                                                 int64_t, int64_t, __nv_bfloat16*,
                                                                 cudaStream_t);
template absl::Status SmallMLinear<__nv_bfloat16, float>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, int64_t, int64_t,
                                                         int64_t, float*, cudaStream_t);
template absl::Status SmallMLinear<__half, __half>(const __half*, const __half*, const __half*,
                                                   int64_t, int64_t, int64_t, __half*,
                                                   cudaStream_t);
template absl::Status SmallMLinear<__half, float>(const __half*, const __half*, const __half*,
                                                  int64_t, int64_t, int64_t, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
