// BlockSum / BlockMax: the sum / max of one float per thread over a thread block, device code
// only.
//
// One owner for the block reduction that kernels/ (RMSNorm, the MoE combine's shared-expert gate)
// and comm/ (the custom all-reduce's fused RMSNorm epilogue) share. It lives in common/ because
// comm/ sits below kernels/ (tests/check_deps.sh) and both may use common/; it is a header with
// no kernel and no host code.
//
// The order of the float additions is fixed, so every caller gets the same bits for the same
// inputs (comm's fused norm is matched bit for bit against kernels/layers/cuda's RmsNorm): a
// butterfly over each warp's 32 lanes (offsets 16, 8, 4, 2, 1), then warp 0's sum + warp 1's + ...
// in warp order, added by every thread, so every thread returns the same value.
#pragma once

namespace tandem {

// REQUIRES: blockDim.x == kThreads, all threads of the block call it (it has a __syncthreads);
// warp_sums: __shared__, kThreads / 32 floats. The caller must __syncthreads() before writing
// warp_sums again (e.g. a second BlockSum over the same array).
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* warp_sums) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps");
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) v += warp_sums[w];
  return v;
}

// The same contract as BlockSum (kernels/attention/cuda's N-way split merge: the partials' largest
// LSE); fmaxf, so a NaN input is dropped for any other value.
template <int kThreads>
__device__ __forceinline__ float BlockMax(float v, float* warp_sums) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps");
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_sums[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, warp_sums[w]);
  return v;
}

}  // namespace tandem
