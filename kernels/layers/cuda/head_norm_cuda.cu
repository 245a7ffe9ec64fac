#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/layers/cuda/head_norm_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 32;  // head_dim <= 1024

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    QkHeadRmsNormKernel(T* qkv, int64_t qkv_stride, int64_t num_pairs, int heads_per_token,
                        int num_q_heads, int head_dim, const T* __restrict__ q_weight,
                        const T* __restrict__ k_weight, float eps) {
  const int64_t pair = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (pair >= num_pairs) return;
  const int lane = threadIdx.x & 31;
  const int64_t token = pair / heads_per_token;
  const int head = static_cast<int>(pair % heads_per_token);
  T* x = qkv + token * qkv_stride + static_cast<int64_t>(head) * head_dim;
  const T* w = head < num_q_heads ? q_weight : k_weight;
  float v[kMaxPerLane];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    v[i] = d < head_dim ? ToFloat(x[d]) : 0.0f;
    sum_sq = fmaf(v[i], v[i], sum_sq);
  }
  for (int off = 16; off > 0; off >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, off);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(head_dim) + eps);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) x[d] = FromFloat<T>((v[i] * inv_rms) * ToFloat(w[d]));
  }
}

}  // namespace

template <typename T>
absl::Status QkHeadRmsNorm(T* qkv, int64_t qkv_stride, int64_t num_tokens, int64_t num_q_heads,
                           int64_t num_kv_heads, int64_t head_dim, const T* q_weight,
                           const T* k_weight, float eps, cudaStream_t stream) {
  if (head_dim < 1 || head_dim > 32 * kMaxPerLane || num_q_heads < 0 || num_kv_heads < 0 ||
      qkv_stride < (num_q_heads + num_kv_heads) * head_dim || num_tokens < 0 || qkv == nullptr ||
      q_weight == nullptr || k_weight == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QkHeadRmsNorm: head_dim ", head_dim, " (1..", 32 * kMaxPerLane, "), ", num_q_heads,
        " q + ", num_kv_heads, " k heads in rows of ", qkv_stride, ", tokens ", num_tokens));
  }
  const int64_t pairs = num_tokens * (num_q_heads + num_kv_heads);
  if (pairs == 0) return absl::OkStatus();
  QkHeadRmsNormKernel<T>
      <<<static_cast<unsigned>((pairs + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
          qkv, qkv_stride, pairs, static_cast<int>(num_q_heads + num_kv_heads),
          static_cast<int>(num_q_heads), static_cast<int>(head_dim), q_weight, k_weight, eps);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status QkHeadRmsNorm<__nv_bfloat16>(__nv_bfloat16*, int64_t, int64_t, int64_t,
                                                   int64_t, int64_t, const __nv_bfloat16*,
                                                   const __nv_bfloat16*, float, cudaStream_t);
template absl::Status QkHeadRmsNorm<__half>(__half*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                            const __half*, const __half*, float, cudaStream_t);

}  // namespace tandem::kernels::cuda
