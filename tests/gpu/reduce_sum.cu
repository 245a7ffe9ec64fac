#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_status.h"
#include "tests/gpu/reduce_sum.h"

namespace tandem::gpu_smoke {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 2048;  // enough to fill 132 SMs many times over

__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;  // valid in thread 0
}

// Pass 1: each block writes the sum of its grid-stride share to partials[blockIdx.x].
__global__ void __launch_bounds__(kThreads)
    PartialSums(const float* __restrict__ in, int64_t n, bool vec4, double* __restrict__ partials) {
  float acc = 0.f;
  const int64_t tid = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  int64_t done = 0;
  if (vec4) {  // 16-byte loads when the base pointer allows them
    const int64_t n4 = n / 4;
    const float4* in4 = reinterpret_cast<const float4*>(in);
    for (int64_t i = tid; i < n4; i += stride) {
      float4 x = __ldg(in4 + i);
      acc += (x.x + x.y) + (x.z + x.w);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) acc += __ldg(in + i);
  double block = BlockSum(static_cast<double>(acc));
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

// Pass 2: one block adds the partials.
__global__ void __launch_bounds__(kThreads)
    FinalSum(const double* __restrict__ partials, int num_partials, double* __restrict__ out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += kThreads) acc += partials[i];
  double total = BlockSum(acc);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

int64_t ReduceSumWorkspaceBytes() { return int64_t{kMaxBlocks} * sizeof(double); }

absl::Status ReduceSumF32(const float* d_in, int64_t n, double* d_out, void* d_workspace,
                          cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("ReduceSumF32: n must be >= 0");
  if (d_out == nullptr || d_workspace == nullptr || (n > 0 && d_in == nullptr)) {
    return absl::InvalidArgumentError("ReduceSumF32: null pointer");
  }
  const bool vec4 = reinterpret_cast<uintptr_t>(d_in) % 16 == 0;
  const int64_t per_block = int64_t{kThreads} * 4 * 4;  // at least 4 float4s per thread
  const int blocks = static_cast<int>(n == 0 ? 1
                                      : (n + per_block - 1) / per_block < kMaxBlocks
                                          ? (n + per_block - 1) / per_block
                                          : kMaxBlocks);
  auto* partials = static_cast<double*>(d_workspace);
  PartialSums<<<blocks, kThreads, 0, stream>>>(d_in, n, vec4, partials);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FinalSum<<<1, kThreads, 0, stream>>>(partials, blocks, d_out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::gpu_smoke
