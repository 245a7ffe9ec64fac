// Two-way merge: one thread per 16-byte vector of a row; the row's two lse values are read by
// every thread of the row (L1 broadcast), so no shared memory or synchronization is needed.
// N-way: a warp per row for a few partials (DCP's ranks), CTAs per row for many (split-KV).
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
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
// (N is the DCP size, a handful), then owns 16-byte vectors of the partials' row and sums them
// over the non-empty partials in index order. TIn: the partials' type, TOut: out's.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    MergeNKernel(const AttnPartials<TIn> parts, int64_t rows, int vecs_per_row, TOut* out,
                 float* lse) {
  constexpr int kVec = 16 / sizeof(TIn);
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
      const auto x = *reinterpret_cast<const Vec<TIn, kVec>*>(parts.out + i * parts.out_stride +
                                                              (r * vecs_per_row + j) * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] = fmaf(w, ToFloat(x.v[e]), acc[e]);
    }
    // One non-empty partial: w = sum = 1, so acc * inv is that partial's value, exactly.
    Vec<TOut, kVec> res;
#pragma unroll
    for (int e = 0; e < kVec; ++e) res.v[e] = FromFloat<TOut>(acc[e] * inv);
    *reinterpret_cast<Vec<TOut, kVec>*>(out + (r * vecs_per_row + j) * kVec) = res;
  }
  if (lse != nullptr && lane == 0) lse[r] = all_empty ? -INFINITY : m + logf(sum);
}

// Where MergeAttnStatesN takes MergeNWideKernel: more than kWarpMergeMaxParts partials, or over
// at most kWideMergeMaxRows rows where a lane of the warp-per-row kernel would read more than
// kWarpMergeMaxLaneLoads vectors one after another (partials x ceil(row vectors / 32)); up to
// kWideMergeMaxParts partials (their weights sit in shared memory). Measured (nvidia-h200 and
// -x2): split-KV's fp32 partials of 512-wide latents over one token's 128 heads need it (64
// partials: 16 CTAs of the warp kernel, ~70 us; CTAs per row slice ~6 us. 8 partials: the whole
// MLA call 24.8 us on the warp kernel, 18.9 on CTAs per row); few partials over many rows do
// not (MLA 16 x 128 rows, 4 partials: the call 66.7 us on the warp kernel, 90.4 on CTAs per row
// slice; DCP's 2 bf16 partials of 128-wide heads, dcp_bench llama3-8b batch 64, 1024 rows: 2.7 vs
// 6.9 us).
constexpr int64_t kWarpMergeMaxParts = 8;
constexpr int64_t kWarpMergeMaxLaneLoads = 8;
constexpr int64_t kWideMergeMaxRows = 256;
constexpr int64_t kWideMergeMaxParts = 8192;
constexpr int kWideVecs = 32;   // 16-byte vectors of a row a CTA sums (grid.y: the row's slices)
constexpr int kWideUnroll = 8;  // partial loads in flight per thread

// One CTA per (row, slice of kWideVecs 16-byte vectors) of an N-way merge with many partials: the
// partials' weights exp(lse - m) into shared memory (0 for an empty one, whose out is never
// read), then thread (g, v) sums vector v of the partials g, g + G, .. (G = kThreads / the
// slice's vectors), and the G group sums are added in group order. Dynamic shared memory:
// num_parts weights, then the group sums [G][slice vectors x kVec].
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    MergeNWideKernel(const AttnPartials<TIn> parts, int vecs_per_row, TOut* out, float* lse) {
  constexpr int kVec = 16 / sizeof(TIn);
  extern __shared__ float wide_smem[];
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int n = static_cast<int>(parts.num_parts);
  float* w = wide_smem;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float l = parts.lse[i * parts.lse_stride + r];
    w[i] = l;
    if (isfinite(l)) m = fmaxf(m, l);  // isfinite: NaN / +-inf lse = an empty partial
  }
  m = BlockMax<kThreads>(m, red);  // its barrier also publishes w
  float part_sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {  // each thread its own entries of w
    const float e = isfinite(w[i]) ? expf(w[i] - m) : 0.0f;
    w[i] = e;
    part_sum += e;
  }
  __syncthreads();                                      // BlockMax's readers of red are done
  const float sum = BlockSum<kThreads>(part_sum, red);  // >= 1 when any partial is non-empty
  const bool all_empty = m == -INFINITY;
  const float inv = all_empty ? 0.0f : 1.0f / sum;
  const int v0 = blockIdx.y * kWideVecs;
  const int vs = min(vecs_per_row - v0, kWideVecs), groups = kThreads / vs;
  const int g = threadIdx.x / vs, v = v0 + threadIdx.x % vs;
  float acc[kVec] = {};
  if (g < groups) {
    for (int i0 = g; i0 < n; i0 += groups * kWideUnroll) {
      Vec<TIn, kVec> x[kWideUnroll];
      float wt[kWideUnroll];
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u) {
        const int i = i0 + u * groups;
        wt[u] = i < n ? w[i] : 0.0f;
        if (wt[u] != 0.0f) {
          x[u] = *reinterpret_cast<const Vec<TIn, kVec>*>(parts.out + i * parts.out_stride +
                                                          (r * vecs_per_row + v) * kVec);
        }
      }
#pragma unroll
      for (int u = 0; u < kWideUnroll; ++u) {
        if (wt[u] == 0.0f) continue;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] = fmaf(wt[u], ToFloat(x[u].v[e]), acc[e]);
      }
    }
  }
  float* group_sums = wide_smem + n;
  if (g < groups) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) group_sums[(g * vs + v - v0) * kVec + e] = acc[e];
  }
  __syncthreads();
  for (int k = threadIdx.x; k < vs * kVec; k += kThreads) {
    float total = 0.0f;
    for (int gg = 0; gg < groups; ++gg) total += group_sums[gg * vs * kVec + k];
    out[(r * vecs_per_row + v0) * kVec + k] = FromFloat<TOut>(total * inv);
  }
  if (lse != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
    lse[r] = all_empty ? -INFINITY : m + logf(sum);
  }
}

// MergeAttnStatesN's checks and launch, partials of TIn into out of TOut.
template <typename TIn, typename TOut>
absl::Status LaunchMergeN(const char* op, const AttnPartials<TIn>& parts, int64_t num_tokens,
                          int64_t num_heads, int64_t head_dim, TOut* out, float* lse,
                          cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(TIn);
  if (num_tokens < 0 || num_heads < 0 || head_dim <= 0 || parts.num_parts < 0 ||
      parts.out_stride < 0 || parts.lse_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": bad sizes num_tokens=", num_tokens, " num_heads=", num_heads, " head_dim=", head_dim,
        " num_parts=", parts.num_parts, " strides ", parts.out_stride, "/", parts.lse_stride));
  }
  if (head_dim % kVec != 0 || parts.out_stride % kVec != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": head_dim ", head_dim, " and out_stride ",
                                                   parts.out_stride, " must be multiples of ",
                                                   kVec));
  }
  const int64_t rows = num_tokens * num_heads;
  if (rows == 0) return absl::OkStatus();
  if (out == nullptr || (parts.num_parts > 0 && (parts.out == nullptr || parts.lse == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null pointer"));
  }
  // out's vectors: kVec elements of TOut (16 bytes, or 8 for fp32 partials into 16-bit out).
  if (reinterpret_cast<uintptr_t>(out) % (kVec * sizeof(TOut)) != 0 ||
      reinterpret_cast<uintptr_t>(parts.out) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": out pointers must be 16-byte aligned"));
  }
  const int vecs_per_row = static_cast<int>(head_dim / kVec);
  // The warp kernel's lanes each read num_parts x ceil(vecs / 32) vectors one after another.
  const int64_t lane_loads = parts.num_parts * ((vecs_per_row + 31) / 32);
  const bool wide = parts.num_parts > kWarpMergeMaxParts ||
                    (lane_loads > kWarpMergeMaxLaneLoads && rows <= kWideMergeMaxRows);
  if (wide && parts.num_parts <= kWideMergeMaxParts &&
      rows <= std::numeric_limits<int32_t>::max()) {
    const int slices = (vecs_per_row + kWideVecs - 1) / kWideVecs;
    const int vs = std::min(vecs_per_row, kWideVecs), groups = kThreads / vs;
    // <= (8192 + 256 x 4) x 4 bytes: within the default 48 KiB of dynamic shared memory.
    const size_t smem = sizeof(float) * (parts.num_parts + int64_t{groups} * vs * kVec);
    MergeNWideKernel<TIn, TOut><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(slices)),
                                  kThreads, smem, stream>>>(parts, vecs_per_row, out, lse);
  } else {
    const int64_t rows_per_block = kThreads / 32;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    MergeNKernel<TIn, TOut><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        parts, rows, vecs_per_row, out, lse);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
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
  return LaunchMergeN<T, T>("cuda::MergeAttnStatesN", parts, num_tokens, num_heads, head_dim, out,
                            lse, stream);
}

template <typename T>
absl::Status MergeF32AttnStatesN(const AttnPartials<float>& parts, int64_t num_tokens,
                                 int64_t num_heads, int64_t head_dim, T* out, float* lse,
                                 cudaStream_t stream) {
  return LaunchMergeN<float, T>("cuda::MergeF32AttnStatesN", parts, num_tokens, num_heads, head_dim,
                                out, lse, stream);
}

template absl::Status MergeAttnStatesN<float>(const AttnPartials<float>&, int64_t, int64_t, int64_t,
                                              float*, float*, cudaStream_t);
template absl::Status MergeAttnStatesN<__nv_bfloat16>(const AttnPartials<__nv_bfloat16>&, int64_t,
                                                      int64_t, int64_t, __nv_bfloat16*, float*,
                                                      cudaStream_t);
template absl::Status MergeAttnStatesN<__half>(const AttnPartials<__half>&, int64_t, int64_t,
                                               int64_t, __half*, float*, cudaStream_t);

template absl::Status MergeF32AttnStatesN<__nv_bfloat16>(const AttnPartials<float>&, int64_t,
                                                         int64_t, int64_t, __nv_bfloat16*, float*,
                                                         cudaStream_t);
template absl::Status MergeF32AttnStatesN<__half>(const AttnPartials<float>&, int64_t, int64_t,
                                                  int64_t, __half*, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
