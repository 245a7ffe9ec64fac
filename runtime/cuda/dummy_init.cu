#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/sampling/philox.h"
#include "runtime/cuda/dummy_init.h"

namespace tandem::runtime::cuda {
namespace {

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// Each thread makes one pair of normals from one Philox draw (elements 2p and 2p + 1).
template <typename T>
__global__ void FillNormalKernel(T* out, int64_t n, float mean, float stddev, uint64_t seed,
                                 uint64_t stream_id) {
  const kernels::PhiloxKey key = kernels::PhiloxKeyFromSeed(seed);
  const int64_t pairs = (n + 1) / 2;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const kernels::PhiloxCounter counter{{static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32),
                                          static_cast<uint32_t>(stream_id),
                                          static_cast<uint32_t>(stream_id >> 32)}};
    const kernels::PhiloxOutput r = kernels::Philox4x32_10(counter, key);
    // u1 in (0, 1] so log(u1) is finite.
    const float u1 = 1.0f - kernels::UniformFloat(r.x[0]);
    const float u2 = kernels::UniformFloat(r.x[1]);
    const float radius = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    out[2 * p] = FromFloat<T>(mean + stddev * radius * c);
    if (2 * p + 1 < n) out[2 * p + 1] = FromFloat<T>(mean + stddev * radius * s);
  }
}

}  // namespace

template <typename T>
absl::Status FillNormal(T* out, int64_t n, float mean, float stddev, uint64_t seed,
                        uint64_t stream_id, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("FillNormal: n = ", n));
  if (n == 0) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("FillNormal: null output");
  const int64_t pairs = (n + 1) / 2;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((pairs + threads - 1) / threads, 132 * 32);
  FillNormalKernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(out, n, mean, stddev,
                                                                             seed, stream_id);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status FillNormal<float>(float*, int64_t, float, float, uint64_t, uint64_t,
                                        cudaStream_t);
template absl::Status FillNormal<__nv_bfloat16>(__nv_bfloat16*, int64_t, float, float, uint64_t,
                                                uint64_t, cudaStream_t);
template absl::Status FillNormal<__half>(__half*, int64_t, float, float, uint64_t, uint64_t,
                                         cudaStream_t);

}  // namespace tandem::runtime::cuda
