// One thread per 16-byte vector of a row; the row's two lse values are read by every thread of
// the row (L1 broadcast), so no shared memory or synchronization is needed.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/attention/cuda/merge_attn_states_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;

constexpr int kThreads = 256;

// One warp per (token, head) row: every lane reads the row's two lse values before lane 0
// writes the merged one (after __syncwarp), so lse may alias lse_a / lse_b.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MergeKernel(const T* out_a, const float* lse_a, const T* out_b, const float* lse_b,
                int64_t rows, int vecs_per_row, T* out, float* lse) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t r = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float la = lse_a[r];
  const float lb = lse_b[r];
  // isfinite() is false for NaN and +-inf: such a partial carries no usable weight, and a plain
  // max() would carry NaN/+inf into m and poison both sides.
  const bool empty_a = !isfinite(la);
  const bool empty_b = !isfinite(lb);
  const float m = fmaxf(la, lb);
  const float wa = expf(la - m);  // one of the two is exactly 1
  const float wb = expf(lb - m);
  const float sum = wa + wb;
  const float ca = wa / sum, cb = wb / sum;
  for (int j = lane; j < vecs_per_row; j += 32) {
    const int64_t e = (r * vecs_per_row + j) * kVec;
    Vec<T, kVec> res;
    if (empty_a && empty_b) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) res.v[i] = FromFloat<T>(0.0f);
    } else if (empty_a || empty_b) {
      // Copy, not weight by 0: the empty side's out may hold NaN (0 * NaN = NaN).
      res = *reinterpret_cast<const Vec<T, kVec>*>((empty_b ? out_a : out_b) + e);
    } else {
      const auto xa = *reinterpret_cast<const Vec<T, kVec>*>(out_a + e);
      const auto xb = *reinterpret_cast<const Vec<T, kVec>*>(out_b + e);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        res.v[i] = FromFloat<T>(ca * ToFloat(xa.v[i]) + cb * ToFloat(xb.v[i]));
      }
    }
    // Element e of out_a/out_b is read by this lane before it writes out[e]: aliasing is safe.
    *reinterpret_cast<Vec<T, kVec>*>(out + e) = res;
  }
  __syncwarp();
  if (lane == 0) {
    lse[r] = empty_a && empty_b ? -INFINITY : empty_b ? la : empty_a ? lb : m + logf(sum);
  }
}

// One warp per (token, head) row of the N-way merge: every lane reads the row's N lse values
// (N is the DCP size, a handful), then owns 16-byte vectors of the row and sums them over the
// non-empty partials in index order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MergeNKernel(const AttnPartials<T> parts, int64_t rows, int vecs_per_row, T* out, float* lse) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t r = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  // isfinite() drops NaN and +-inf: such a partial is empty (see MergeKernel), and fmaxf over
  // the finite values alone keeps NaN/+inf out of m.
  float m = -INFINITY;
  for (int64_t i = 0; i < parts.num_parts; ++i) {
    const float l = parts.lse[i * parts.lse_stride + r];
    if (isfinite(l)) m = fmaxf(m, l);
  }
  const bool all_empty = m == -INFINITY;
  float sum = 0.0f;
  for (int64_t i = 0; i < parts.num_parts; ++i) {
    const float l = parts.lse[i * parts.lse_stride + r];
    if (isfinite(l)) sum += expf(l - m);  // >= 1 when any partial is non-empty
  }
  const float inv = all_empty ? 0.0f : 1.0f / sum;
  for (int j = lane; j < vecs_per_row; j += 32) {
    float acc[kVec] = {};
    for (int64_t i = 0; i < parts.num_parts; ++i) {
      const float l = parts.lse[i * parts.lse_stride + r];
      if (!isfinite(l)) continue;  // never read: an empty partial's out may be garbage
      const float w = expf(l - m);
      const auto x = *reinterpret_cast<const Vec<T, kVec>*>(parts.out + i * parts.out_stride +
                                                            (r * vecs_per_row + j) * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] = fmaf(w, ToFloat(x.v[e]), acc[e]);
    }
    // One non-empty partial: w = sum = 1, so acc * inv is that partial's value, exactly.
    Vec<T, kVec> res;
#pragma unroll
    for (int e = 0; e < kVec; ++e) res.v[e] = FromFloat<T>(acc[e] * inv);
    *reinterpret_cast<Vec<T, kVec>*>(out + (r * vecs_per_row + j) * kVec) = res;
  }
  if (lse != nullptr && lane == 0) lse[r] = all_empty ? -INFINITY : m + logf(sum);
}

}  // namespace

template <typename T>
absl::Status MergeAttnStates(const T* out_a, const float* lse_a, const T* out_b, const float* lse_b,
                             int64_t num_tokens, int64_t num_heads, int64_t head_dim, T* out,
                             float* lse, cudaStream_t stream) {
  constexpr const char* kOp = "cuda::MergeAttnStates";
  if (num_tokens < 0 || num_heads < 0 || head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": bad sizes num_tokens=", num_tokens,
                                                   " num_heads=", num_heads,
                                                   " head_dim=", head_dim));
  }
  constexpr int kVec = 16 / sizeof(T);
  if (head_dim % kVec != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": head_dim ", head_dim, " must be a multiple of ", kVec));
  }
  const int64_t rows = num_tokens * num_heads;
  if (rows == 0) return absl::OkStatus();
  if (out_a == nullptr || lse_a == nullptr || out_b == nullptr || lse_b == nullptr ||
      out == nullptr || lse == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": null pointer"));
  }
  for (const void* p : {static_cast<const void*>(out_a), static_cast<const void*>(out_b),
                        static_cast<const void*>(out)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": out pointers must be 16-byte aligned"));
    }
  }
  const int vecs_per_row = static_cast<int>(head_dim / kVec);
  const int64_t rows_per_block = kThreads / 32;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  MergeKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      out_a, lse_a, out_b, lse_b, rows, vecs_per_row, out, lse);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status MergeAttnStates<float>(const float*, const float*, const float*, const float*,
                                             int64_t, int64_t, int64_t, float*, float*,
                                             cudaStream_t);
template absl::Status MergeAttnStates<__nv_bfloat16>(const __nv_bfloat16*, const float*,
                                                     const __nv_bfloat16*, const float*, int64_t,
                                                     int64_t, int64_t, __nv_bfloat16*, float*,
                                                     cudaStream_t);
template absl::Status MergeAttnStates<__half>(const __half*, const float*, const __half*,
                                              const float*, int64_t, int64_t, int64_t, __half*,
                                              float*, cudaStream_t);

template <typename T>
absl::Status MergeAttnStatesN(const AttnPartials<T>& parts, int64_t num_tokens, int64_t num_heads,
                              int64_t head_dim, T* out, float* lse, cudaStream_t stream) {
  constexpr const char* kOp = "cuda::MergeAttnStatesN";
  constexpr int kVec = 16 / sizeof(T);
  if (num_tokens < 0 || num_heads < 0 || head_dim <= 0 || parts.num_parts < 0 ||
      parts.out_stride < 0 || parts.lse_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": bad sizes num_tokens=", num_tokens,
                                                   " num_heads=", num_heads, " head_dim=", head_dim,
                                                   " num_parts=", parts.num_parts, " strides ",
                                                   parts.out_stride, "/", parts.lse_stride));
  }
  if (head_dim % kVec != 0 || parts.out_stride % kVec != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": head_dim ", head_dim, " and out_stride ",
                                                   parts.out_stride, " must be multiples of ",
                                                   kVec));
  }
  const int64_t rows = num_tokens * num_heads;
  if (rows == 0) return absl::OkStatus();
  if (out == nullptr || (parts.num_parts > 0 && (parts.out == nullptr || parts.lse == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": null pointer"));
  }
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(parts.out) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out pointers must be 16-byte aligned"));
  }
  const int64_t rows_per_block = kThreads / 32;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  MergeNKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      parts, rows, static_cast<int>(head_dim / kVec), out, lse);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status MergeAttnStatesN<float>(const AttnPartials<float>&, int64_t, int64_t, int64_t,
                                              float*, float*, cudaStream_t);
template absl::Status MergeAttnStatesN<__nv_bfloat16>(const AttnPartials<__nv_bfloat16>&, int64_t,
                                                      int64_t, int64_t, __nv_bfloat16*, float*,
                                                      cudaStream_t);
template absl::Status MergeAttnStatesN<__half>(const AttnPartials<__half>&, int64_t, int64_t,
                                               int64_t, __half*, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
