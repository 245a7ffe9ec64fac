// Conversion, gather and bias kernels: grid-stride loops over 16-byte vectors where pointers
// and row lengths allow, element loops otherwise (views at odd offsets stay legal).
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/layers/cuda/convert_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;

constexpr int kThreads = 256;

template <typename... Args>
absl::Status Invalid(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("cuda::", op, ": ", args...));
}

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Enough blocks to cover `work` items once, capped: the loops are grid-stride.
unsigned Blocks(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// kVectorized: 8 elements per step (two float4 loads in, one 16-byte store out), then an
// element loop for the tail; otherwise only the element loop.
template <typename T, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    ConvertKernel(const float* __restrict__ in, int64_t n, T* __restrict__ out) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t vecs = kVectorized ? n / 8 : 0;
  if constexpr (kVectorized) {
    for (int64_t v = blockIdx.x * int64_t{kThreads} + threadIdx.x; v < vecs; v += stride) {
      // Vec<float, 8> would demand 32-byte alignment: two 16-byte halves.
      const Vec<float, 4> lo = reinterpret_cast<const Vec<float, 4>*>(in)[2 * v];
      const Vec<float, 4> hi = reinterpret_cast<const Vec<float, 4>*>(in)[2 * v + 1];
      Vec<T, 8> y;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        y.v[j] = FromFloat<T>(lo.v[j]);  // __float2*_rn: round to nearest even
        y.v[j + 4] = FromFloat<T>(hi.v[j]);
      }
      reinterpret_cast<Vec<T, 8>*>(out)[v] = y;
    }
  }
  for (int64_t i = vecs * 8 + blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += stride) {
    out[i] = FromFloat<T>(in[i]);
  }
}

// Copies rows in units of U (uint4 when rows are 16-byte multiples and aligned, else T).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    WidenKernel(const T* __restrict__ in, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = ToFloat(in[i]);
  }
}

template <typename U>
__global__ void __launch_bounds__(kThreads)
    GatherKernel(const U* __restrict__ in, int64_t units_per_row, const int32_t* __restrict__ rows,
                 int64_t num_rows, U* __restrict__ out) {
  const int64_t total = num_rows * units_per_row;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t r = idx / units_per_row;
    const int64_t u = idx - r * units_per_row;
    const int32_t src = rows[r];
    out[idx] = src >= 0 ? in[int64_t{src} * units_per_row + u] : U{};  // negative: padding
  }
}

template <typename T, typename TBias, int kVec>
__global__ void __launch_bounds__(kThreads)
    AddBiasKernel(T* x, const TBias* __restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t vecs_per_row = cols / kVec;
  const int64_t total = rows * vecs_per_row;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t c = (idx % vecs_per_row) * kVec;
    Vec<T, kVec>* px = reinterpret_cast<Vec<T, kVec>*>(x) + idx;
    Vec<T, kVec> v = *px;
    const Vec<TBias, kVec> b = *reinterpret_cast<const Vec<TBias, kVec>*>(bias + c);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v.v[j] = FromFloat<T>(ToFloat(v.v[j]) + ToFloat(b.v[j]));
    *px = v;
  }
}

}  // namespace

template <typename T>
absl::Status ConvertFromF32(const float* in, int64_t n, T* out, cudaStream_t stream) {
  if (n < 0) return Invalid("ConvertFromF32", "n must be >= 0, got ", n);
  if (n == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) return Invalid("ConvertFromF32", "null in or out");
  if (Aligned(in, 16) && Aligned(out, 16)) {
    ConvertKernel<T, true><<<Blocks(n / 8 + 1), kThreads, 0, stream>>>(in, n, out);
  } else {
    ConvertKernel<T, false><<<Blocks(n), kThreads, 0, stream>>>(in, n, out);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status ConvertToF32(const T* in, int64_t n, float* out, cudaStream_t stream) {
  if (n < 0) return Invalid("ConvertToF32", "n must be >= 0, got ", n);
  if (n == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) return Invalid("ConvertToF32", "null in or out");
  WidenKernel<T><<<Blocks(n), kThreads, 0, stream>>>(in, n, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status GatherRows(const T* in, int64_t row_elems, const int32_t* rows, int64_t num_rows,
                        T* out, cudaStream_t stream) {
  if (row_elems < 0 || num_rows < 0) {
    return Invalid("GatherRows", "sizes must be >= 0, got row_elems ", row_elems, ", num_rows ",
                   num_rows);
  }
  if (row_elems == 0 || num_rows == 0) return absl::OkStatus();
  if (in == nullptr || rows == nullptr || out == nullptr) {
    return Invalid("GatherRows", "null in, rows or out");
  }
  const int64_t row_bytes = row_elems * static_cast<int64_t>(sizeof(T));
  if (row_bytes % 16 == 0 && Aligned(in, 16) && Aligned(out, 16)) {
    const int64_t units = row_bytes / 16;
    GatherKernel<uint4><<<Blocks(num_rows * units), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(in), units, rows, num_rows, reinterpret_cast<uint4*>(out));
  } else {
    GatherKernel<T>
        <<<Blocks(num_rows * row_elems), kThreads, 0, stream>>>(in, row_elems, rows, num_rows, out);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T, typename TBias>
absl::Status AddBias(T* x, const TBias* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0) {
    return Invalid("AddBias", "sizes must be >= 0, got rows ", rows, ", cols ", cols);
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (x == nullptr || bias == nullptr) return Invalid("AddBias", "null x or bias");
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && Aligned(x, 16) && Aligned(bias, sizeof(TBias) * kVec)) {
    AddBiasKernel<T, TBias, kVec>
        <<<Blocks(rows * (cols / kVec)), kThreads, 0, stream>>>(x, bias, rows, cols);
  } else {
    AddBiasKernel<T, TBias, 1><<<Blocks(rows * cols), kThreads, 0, stream>>>(x, bias, rows, cols);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status ConvertFromF32<__nv_bfloat16>(const float*, int64_t, __nv_bfloat16*,
                                                    cudaStream_t);
template absl::Status ConvertFromF32<__half>(const float*, int64_t, __half*, cudaStream_t);
template absl::Status ConvertToF32<__nv_bfloat16>(const __nv_bfloat16*, int64_t, float*,
                                                  cudaStream_t);
template absl::Status ConvertToF32<__half>(const __half*, int64_t, float*, cudaStream_t);
#define TANDEM_CONVERT_CUDA_INSTANTIATE(T)                                            \
  template absl::Status GatherRows<T>(const T*, int64_t, const int32_t*, int64_t, T*, \
                                      cudaStream_t);                                  \
  template absl::Status AddBias<T, T>(T*, const T*, int64_t, int64_t, cudaStream_t);
TANDEM_CONVERT_CUDA_INSTANTIATE(float)
TANDEM_CONVERT_CUDA_INSTANTIATE(__nv_bfloat16)
TANDEM_CONVERT_CUDA_INSTANTIATE(__half)
#undef TANDEM_CONVERT_CUDA_INSTANTIATE
template absl::Status AddBias<float, __nv_bfloat16>(float*, const __nv_bfloat16*, int64_t, int64_t,
                                                    cudaStream_t);
template absl::Status AddBias<float, __half>(float*, const __half*, int64_t, int64_t, cudaStream_t);

}  // namespace tandem::kernels::cuda
