// MoeGatherRows, the decode expert GEMVs and MoeCombine (moe_cuda.h).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {
namespace {

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane
constexpr int kCombineThreads = 128;

// acc[q][m] = w_q . a_m over R weight rows at once (k elements each; every row's loads in flight
// together), this lane's share, then summed over the warp. kVec: 16-byte loads of 8 elements
// (k % 8 == 0, rows 16-byte aligned). Each (q, m) sum runs in the same order as for one row
// alone: results do not depend on R.
template <typename T, int R, int M, bool kVec>
__device__ __forceinline__ void WarpDot(const T* const (&w)[R], const T* const (&a)[M], int64_t k,
                                        int lane, float (&acc)[R][M]) {
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[q][m] = 0.0f;
  }
  if constexpr (kVec) {
    const int64_t chunks = k / 8;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
      uint4 held[R][kUnroll];
#pragma unroll
      for (int q = 0; q < R; ++q) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = c0 + 32 * u;
          held[q][u] = c < chunks ? __ldcs(reinterpret_cast<const uint4*>(w[q]) + c)
                                  : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 av = __ldg(reinterpret_cast<const uint4*>(a[m]) + c);
          const T* at = reinterpret_cast<const T*>(&av);
          float af[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) af[e] = ToFloat(at[e]);
#pragma unroll
          for (int q = 0; q < R; ++q) {
            const T* wt = reinterpret_cast<const T*>(&held[q][u]);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[q][m] = fmaf(ToFloat(wt[e]), af[e], acc[q][m]);
          }
        }
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const float wf = ToFloat(w[q][i]);
#pragma unroll
        for (int m = 0; m < M; ++m) acc[q][m] = fmaf(wf, ToFloat(a[m][i]), acc[q][m]);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        acc[q][m] += __shfl_xor_sync(0xffffffffu, acc[q][m], off);
      }
    }
  }
}

// Block (feature tile, active-expert slot); each warp streams two weight rows at once.
// kGateUp: warp = output column j of act (gate row j and up row inter + j of the expert, input
// rows gathered through token_of_row); else warp = output features h, h + 1 of down (input rows
// the expert's contiguous act rows).
constexpr int kRowsPerWarp = 2;
template <typename T, int M, bool kGateUp, bool kVec>
__global__ void __launch_bounds__(kGemvWarps * 32)
    ExpertGemvKernel(const T* __restrict__ in, const T* __restrict__ w, int64_t n_out, int64_t k,
                     DeviceMoePermutation perm, T* __restrict__ out) {
  internal::WaitForPrecedingGrid();  // PDL: the permutation and `in` are the predecessors'
  internal::AllowDependentLaunch();
  constexpr int kFeat = kGateUp ? 1 : kRowsPerWarp;  // output features per warp
  const int expert = perm.active_experts[blockIdx.y];
  const int64_t feature = (int64_t{blockIdx.x} * kGemvWarps + (threadIdx.x >> 5)) * kFeat;
  if (expert < 0 || feature >= n_out) return;
  const int lane = threadIdx.x & 31;
  const int begin = perm.expert_offsets[expert], end = perm.expert_offsets[expert + 1];
  const T* wrow[kRowsPerWarp];
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) {
    // gate_up: [E, 2 * n_out, k], rows feature and n_out + feature; down: [E, n_out, k], rows
    // feature, feature + 1 (the last one repeated past n_out, not stored).
    const int64_t row = kGateUp ? q * n_out + feature : min(feature + q, n_out - 1);
    wrow[q] = w + (static_cast<int64_t>(expert) * (kGateUp ? 2 : 1) * n_out + row) * k;
  }
  for (int r0 = begin; r0 < end; r0 += M) {
    const T* a[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int r = min(r0 + m, end - 1);  // past the expert's rows: a repeat, not stored
      a[m] = in + static_cast<int64_t>(kGateUp ? perm.token_of_row[r] : r) * k;
    }
    float acc[kRowsPerWarp][M];
    WarpDot<T, kRowsPerWarp, M, kVec>(wrow, a, k, lane, acc);
    if (lane != 0) continue;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (r0 + m >= end) break;
      T* dst = out + static_cast<int64_t>(r0 + m) * n_out + feature;
      if constexpr (kGateUp) {
        // Gate and up rounded to T first, then SiluAndMul's expression (layers_cuda.h).
        const float g = ToFloat(FromFloat<T>(acc[0][m]));
        const float u = ToFloat(FromFloat<T>(acc[1][m]));
        *dst = FromFloat<T>(g / (1.0f + expf(-g)) * u);
      } else {
#pragma unroll
        for (int q = 0; q < kFeat; ++q) {
          if (feature + q < n_out) dst[q] = FromFloat<T>(acc[q][m]);
        }
      }
    }
  }
}

// The one place where rows per expert and alignment become template constants.
template <typename T, bool kGateUp>
absl::Status LaunchGemv(const T* in, const T* w, int64_t n_out, int64_t k,
                        const DeviceMoePermutation& perm, int64_t num_experts, int64_t rows, T* out,
                        cudaStream_t stream, bool programmatic_launch) {
  if (n_out < 1 || k < 1 || num_experts < 1 || num_experts > kMoeMaxExperts || rows < 0 ||
      n_out > int64_t{kGemvWarps} * 65535 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExpertGemv: outputs ", n_out, ", inputs ", k,
                                                   ", experts ", num_experts, ", rows ", rows));
  }
  if (rows == 0) return absl::OkStatus();
  const int64_t per_block = int64_t{kGemvWarps} * (kGateUp ? 1 : kRowsPerWarp);
  const dim3 grid(static_cast<unsigned>((n_out + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min(num_experts, rows)));
  const bool vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;
  // Rows streamed per weight read: the mean rows per expert, rounded up to 1, 2, 4 or 8.
  const int64_t mean = (rows + num_experts - 1) / num_experts;
  const internal::PdlLaunchConfig config(grid, dim3(kGemvWarps * 32), stream, programmatic_launch);
  cudaError_t launched = cudaSuccess;
  auto launch = [&](auto kernel) {
    launched = cudaLaunchKernelEx(config.get(), kernel, in, w, n_out, k, perm, out);
  };
  if (vec) {
    if (mean <= 1)
      launch(ExpertGemvKernel<T, 1, kGateUp, true>);
    else if (mean <= 2)
      launch(ExpertGemvKernel<T, 2, kGateUp, true>);
    else if (mean <= 4)
      launch(ExpertGemvKernel<T, 4, kGateUp, true>);
    else
      launch(ExpertGemvKernel<T, 8, kGateUp, true>);
  } else {
    if (mean <= 1)
      launch(ExpertGemvKernel<T, 1, kGateUp, false>);
    else
      launch(ExpertGemvKernel<T, 4, kGateUp, false>);
  }
  CUDA_RETURN_IF_ERROR(launched);
  return absl::OkStatus();
}

template <typename T, bool kVec>
__global__ void GatherKernel(const T* __restrict__ x, int64_t hidden,
                             const int32_t* __restrict__ token_of_row, T* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const T* src = x + static_cast<int64_t>(token_of_row[r]) * hidden;
  T* dst = out + r * hidden;
  if constexpr (kVec) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, int64_t rows, int64_t inter,
                              T* __restrict__ out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / inter, j = i % inter;
    const float g = ToFloat(gate_up[r * 2 * inter + j]);
    const float u = ToFloat(gate_up[r * 2 * inter + inter + j]);
    out[i] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

// Block (i, e): expert e's i-th row, if it has one.
template <typename T>
__global__ void PadRowsKernel(const T* __restrict__ x, int64_t hidden, DeviceMoePermutation perm,
                              int64_t cap, T* __restrict__ out) {
  const int e = blockIdx.y, i = blockIdx.x;
  const int begin = perm.expert_offsets[e];
  if (begin + i >= perm.expert_offsets[e + 1]) return;
  const T* src = x + static_cast<int64_t>(perm.token_of_row[begin + i]) * hidden;
  T* dst = out + (static_cast<int64_t>(e) * cap + i) * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
}

__global__ void PaddedRowOfPairKernel(const int32_t* __restrict__ ids, DeviceMoePermutation perm,
                                      int64_t num_pairs, int64_t cap, int32_t* __restrict__ out) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= num_pairs) return;
  const int e = ids[p];
  out[p] = static_cast<int32_t>(e * cap + perm.row_of_pair[p] - perm.expert_offsets[e]);
}

// One block per token. kAddTo: out[t] = round(out[t] + round(sum)) (FusedAddRmsNorm's residual
// update of the rounded sum) instead of round(sum).
template <typename T, bool kAddTo = false>
__global__ void __launch_bounds__(kCombineThreads)
    CombineKernel(const T* __restrict__ expert_out, const float* __restrict__ weights,
                  const int32_t* __restrict__ row_of_pair, int top_k, int64_t hidden,
                  const T* __restrict__ shared, const T* __restrict__ shared_gate, const T* x,
                  T* out) {
  __shared__ float red[kCombineThreads / 32];
  const int64_t t = blockIdx.x;
  float gate = 1.0f;
  if (shared != nullptr && shared_gate != nullptr) {
    float dot = 0.0f;
    for (int64_t h = threadIdx.x; h < hidden; h += kCombineThreads) {
      dot = fmaf(ToFloat(x[t * hidden + h]), ToFloat(shared_gate[h]), dot);
    }
    gate = 1.0f / (1.0f + expf(-BlockSum<kCombineThreads>(dot, red)));
  }
  __syncthreads();  // x (may alias out) fully read before any write
  constexpr int kMaxK = 16;
  const T* src[kMaxK];
  float wt[kMaxK];
  for (int j = 0; j < top_k && j < kMaxK; ++j) {
    src[j] = expert_out + static_cast<int64_t>(row_of_pair[t * top_k + j]) * hidden;
    wt[j] = weights[t * top_k + j];
  }
  for (int64_t h = threadIdx.x; h < hidden; h += kCombineThreads) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const T* s = j < kMaxK
                       ? src[j]
                       : expert_out + static_cast<int64_t>(row_of_pair[t * top_k + j]) * hidden;
      const float wj = j < kMaxK ? wt[j] : weights[t * top_k + j];
      acc = fmaf(wj, ToFloat(s[h]), acc);
    }
    if (shared != nullptr) acc = fmaf(gate, ToFloat(shared[t * hidden + h]), acc);
    if constexpr (kAddTo) {
      out[t * hidden + h] = FromFloat<T>(ToFloat(out[t * hidden + h]) + ToFloat(FromFloat<T>(acc)));
    } else {
      out[t * hidden + h] = FromFloat<T>(acc);
    }
  }
}

// The split combine: block (chunk, t) owns kSplitThreads * V elements of token t's row (V = 8:
// 16-byte loads, every j's load in flight at once; V = 1: element loads). The sum per element is
// in the same fixed j order as CombineKernel (fp32 fma chain): identical bits without a gated
// shared expert (the gate's dot product is summed in another order: last-bit differences). The
// gate's dot product is repeated by every block of the token (x must not alias out then: the
// launcher gives one block per token in that case).
// kAddTo: as CombineKernel's.
constexpr int kSplitThreads = 64;
template <typename T, int V, bool kAddTo = false>
__global__ void __launch_bounds__(kSplitThreads)
    CombineSplitKernel(const T* __restrict__ expert_out, const float* __restrict__ weights,
                       const int32_t* __restrict__ row_of_pair, int top_k, int64_t hidden,
                       const T* __restrict__ shared, const T* __restrict__ shared_gate, const T* x,
                       T* out) {
  __shared__ float red[kSplitThreads / 32];
  internal::WaitForPrecedingGrid();  // PDL: expert_out, shared and x are the predecessors'
  internal::AllowDependentLaunch();
  const int64_t t = blockIdx.y;
  float gate = 1.0f;
  if (shared != nullptr && shared_gate != nullptr) {
    float dot = 0.0f;
    for (int64_t h = threadIdx.x; h < hidden; h += kSplitThreads) {
      dot = fmaf(ToFloat(x[t * hidden + h]), ToFloat(shared_gate[h]), dot);
    }
    gate = 1.0f / (1.0f + expf(-BlockSum<kSplitThreads>(dot, red)));
    __syncthreads();
  }
  const int64_t h0 = (int64_t{blockIdx.x} * kSplitThreads + threadIdx.x) * V;
  if (h0 >= hidden) return;
  const int32_t* rows = row_of_pair + t * top_k;
  const float* wt = weights + t * top_k;
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.0f;
  if constexpr (V == 8) {
    constexpr int kBatch = 8;  // loads in flight per thread
    for (int j0 = 0; j0 < top_k; j0 += kBatch) {
      uint4 held[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (j0 + u < top_k) {
          held[u] = __ldg(reinterpret_cast<const uint4*>(
              expert_out + static_cast<int64_t>(rows[j0 + u]) * hidden + h0));
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (j0 + u >= top_k) break;
        const float wj = wt[j0 + u];
        const T* v = reinterpret_cast<const T*>(&held[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = fmaf(wj, ToFloat(v[e]), acc[e]);
      }
    }
    T res[8];
    uint4 sv = make_uint4(0, 0, 0, 0);
    if (shared != nullptr) sv = __ldg(reinterpret_cast<const uint4*>(shared + t * hidden + h0));
    const T* sh = reinterpret_cast<const T*>(&sv);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (shared != nullptr) acc[e] = fmaf(gate, ToFloat(sh[e]), acc[e]);
      res[e] = FromFloat<T>(acc[e]);
    }
    if constexpr (kAddTo) {
      const uint4 rv = *reinterpret_cast<const uint4*>(out + t * hidden + h0);
      const T* r = reinterpret_cast<const T*>(&rv);
#pragma unroll
      for (int e = 0; e < 8; ++e) res[e] = FromFloat<T>(ToFloat(r[e]) + ToFloat(res[e]));
    }
    *reinterpret_cast<uint4*>(out + t * hidden + h0) = *reinterpret_cast<const uint4*>(res);
  } else {
    for (int j = 0; j < top_k; ++j) {
      acc[0] =
          fmaf(wt[j], ToFloat(expert_out[static_cast<int64_t>(rows[j]) * hidden + h0]), acc[0]);
    }
    if (shared != nullptr) acc[0] = fmaf(gate, ToFloat(shared[t * hidden + h0]), acc[0]);
    if constexpr (kAddTo) {
      out[t * hidden + h0] =
          FromFloat<T>(ToFloat(out[t * hidden + h0]) + ToFloat(FromFloat<T>(acc[0])));
    } else {
      out[t * hidden + h0] = FromFloat<T>(acc[0]);
    }
  }
}

}  // namespace

template <typename T>
absl::Status MoeGatherRows(const T* x, int64_t hidden, const int32_t* token_of_row, int64_t rows,
                           T* out, cudaStream_t stream) {
  if (hidden < 1 || rows < 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeGatherRows: hidden ", hidden, ", rows ", rows));
  }
  if (rows == 0) return absl::OkStatus();
  const bool vec = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto kernel = vec ? GatherKernel<T, true> : GatherKernel<T, false>;
  kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, hidden, token_of_row, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeExpertGemvGateUp(const T* x, const T* gate_up, int64_t hidden, int64_t inter,
                                 const DeviceMoePermutation& perm, int64_t num_experts,
                                 int64_t rows, T* act, cudaStream_t stream,
                                 bool programmatic_launch) {
  return LaunchGemv<T, true>(x, gate_up, inter, hidden, perm, num_experts, rows, act, stream,
                             programmatic_launch);
}

template <typename T>
absl::Status MoeExpertGemvDown(const T* act, const T* down, int64_t hidden, int64_t inter,
                               const DeviceMoePermutation& perm, int64_t num_experts, int64_t rows,
                               T* out, cudaStream_t stream, bool programmatic_launch) {
  return LaunchGemv<T, false>(act, down, hidden, inter, perm, num_experts, rows, out, stream,
                              programmatic_launch);
}

template <typename T>
absl::Status MoeSiluAndMul(const T* gate_up, int64_t rows, int64_t inter, T* out,
                           cudaStream_t stream) {
  if (rows < 0 || inter < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeSiluAndMul: rows ", rows, ", width ", inter));
  }
  if (rows == 0) return absl::OkStatus();
  const int64_t blocks = std::min<int64_t>((rows * inter + 255) / 256, 132 * 16);
  SiluMulKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(gate_up, rows, inter, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoePadRows(const T* x, int64_t hidden, const int32_t* expert_ids,
                        const DeviceMoePermutation& perm, int64_t num_experts, int64_t num_pairs,
                        int64_t cap, T* out, int32_t* padded_row_of_pair, cudaStream_t stream) {
  if (hidden < 1 || num_experts < 1 || num_experts > kMoeMaxExperts || cap < 1 ||
      cap > 0x7fffffff || num_pairs < 0 || num_experts * cap > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoePadRows: hidden ", hidden, ", experts ", num_experts, ", cap ", cap));
  }
  if (num_pairs == 0) return absl::OkStatus();
  PadRowsKernel<T>
      <<<dim3(static_cast<unsigned>(cap), static_cast<unsigned>(num_experts)), 128, 0, stream>>>(
          x, hidden, perm, cap, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  PaddedRowOfPairKernel<<<static_cast<unsigned>((num_pairs + 255) / 256), 256, 0, stream>>>(
      expert_ids, perm, num_pairs, cap, padded_row_of_pair);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeCombine(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                        int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                        const T* shared_gate, const T* x, T* out, cudaStream_t stream) {
  if (num_tokens < 0 || top_k < 1 || hidden < 1 || (shared_gate != nullptr && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("MoeCombine: tokens ", num_tokens, ", top_k ",
                                                   top_k, ", hidden ", hidden,
                                                   " (a shared gate needs x)"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  CombineKernel<T><<<static_cast<unsigned>(num_tokens), kCombineThreads, 0, stream>>>(
      expert_out, weights, row_of_pair, static_cast<int>(top_k), hidden, shared, shared_gate, x,
      out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeCombineSplit(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                             int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                             const T* shared_gate, const T* x, T* out, cudaStream_t stream,
                             bool programmatic_launch) {
  if (num_tokens < 0 || top_k < 1 || hidden < 1 || (shared_gate != nullptr && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("MoeCombineSplit: tokens ", num_tokens,
                                                   ", top_k ", top_k, ", hidden ", hidden,
                                                   " (a shared gate needs x)"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  // A gated shared expert reads x's whole row in every block of the token: when x overlaps out,
  // one block per token (CombineKernel) keeps the read before the writes. Past 65535 tokens
  // (the grid's y limit) too.
  const auto lo = [](const T* p) { return reinterpret_cast<uintptr_t>(p); };
  const uintptr_t bytes = static_cast<uintptr_t>(num_tokens * hidden) * sizeof(T);
  if (num_tokens > 65535 || (shared != nullptr && shared_gate != nullptr &&
                             lo(x) < lo(out) + bytes && lo(out) < lo(x) + bytes)) {
    return MoeCombine<T>(expert_out, weights, row_of_pair, num_tokens, top_k, hidden, shared,
                         shared_gate, x, out, stream);
  }
  const bool vec = hidden % 8 == 0 && lo(expert_out) % 16 == 0 && lo(out) % 16 == 0 &&
                   (shared == nullptr || lo(shared) % 16 == 0);
  const int v = vec ? 8 : 1;
  const dim3 grid(static_cast<unsigned>((hidden + int64_t{kSplitThreads} * v - 1) /
                                        (int64_t{kSplitThreads} * v)),
                  static_cast<unsigned>(num_tokens));
  const auto kernel = vec ? CombineSplitKernel<T, 8> : CombineSplitKernel<T, 1>;
  const internal::PdlLaunchConfig config(grid, dim3(kSplitThreads), stream, programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), kernel, expert_out, weights, row_of_pair,
                                          static_cast<int>(top_k), hidden, shared, shared_gate, x,
                                          out));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeCombineAddTo(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                             int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                             const T* shared_gate, const T* x, T* residual, bool split,
                             cudaStream_t stream, bool programmatic_launch) {
  const auto lo = [](const T* p) { return reinterpret_cast<uintptr_t>(p); };
  const uintptr_t bytes =
      static_cast<uintptr_t>(std::max<int64_t>(num_tokens * hidden, 0)) * sizeof(T);
  const bool overlap = x != nullptr && lo(x) < lo(residual) + bytes && lo(residual) < lo(x) + bytes;
  if (num_tokens < 0 || top_k < 1 || hidden < 1 || residual == nullptr || overlap ||
      (shared_gate != nullptr && x == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeCombineAddTo: tokens ", num_tokens, ", top_k ", top_k, ", hidden ", hidden,
                     " (a residual not overlapping x needed; a shared gate needs x)"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (!split || num_tokens > 65535) {  // MoeCombine, or MoeCombineSplit's fallback to it
    CombineKernel<T, true><<<static_cast<unsigned>(num_tokens), kCombineThreads, 0, stream>>>(
        expert_out, weights, row_of_pair, static_cast<int>(top_k), hidden, shared, shared_gate, x,
        residual);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const bool vec = hidden % 8 == 0 && lo(expert_out) % 16 == 0 && lo(residual) % 16 == 0 &&
                   (shared == nullptr || lo(shared) % 16 == 0);
  const int v = vec ? 8 : 1;
  const dim3 grid(static_cast<unsigned>((hidden + int64_t{kSplitThreads} * v - 1) /
                                        (int64_t{kSplitThreads} * v)),
                  static_cast<unsigned>(num_tokens));
  const auto kernel = vec ? CombineSplitKernel<T, 8, true> : CombineSplitKernel<T, 1, true>;
  const internal::PdlLaunchConfig config(grid, dim3(kSplitThreads), stream, programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), kernel, expert_out, weights, row_of_pair,
                                          static_cast<int>(top_k), hidden, shared, shared_gate, x,
                                          residual));
  return absl::OkStatus();
}

#define TANDEM_MOE_CUDA_INSTANTIATE(T)                                                            \
  template absl::Status MoeGatherRows<T>(const T*, int64_t, const int32_t*, int64_t, T*,          \
                                         cudaStream_t);                                           \
  template absl::Status MoeExpertGemvGateUp<T>(const T*, const T*, int64_t, int64_t,              \
                                               const DeviceMoePermutation&, int64_t, int64_t, T*, \
                                               cudaStream_t, bool);                               \
  template absl::Status MoeExpertGemvDown<T>(const T*, const T*, int64_t, int64_t,                \
                                             const DeviceMoePermutation&, int64_t, int64_t, T*,   \
                                             cudaStream_t, bool);                                 \
  template absl::Status MoeSiluAndMul<T>(const T*, int64_t, int64_t, T*, cudaStream_t);           \
  template absl::Status MoePadRows<T>(const T*, int64_t, const int32_t*,                          \
                                      const DeviceMoePermutation&, int64_t, int64_t, int64_t, T*, \
                                      int32_t*, cudaStream_t);                                    \
  template absl::Status MoeCombine<T>(const T*, const float*, const int32_t*, int64_t, int64_t,   \
                                      int64_t, const T*, const T*, const T*, T*, cudaStream_t);   \
  template absl::Status MoeCombineSplit<T>(const T*, const float*, const int32_t*, int64_t,       \
                                           int64_t, int64_t, const T*, const T*, const T*, T*,    \
                                           cudaStream_t, bool);                                   \
  template absl::Status MoeCombineAddTo<T>(const T*, const float*, const int32_t*, int64_t,       \
                                           int64_t, int64_t, const T*, const T*, const T*, T*,    \
                                           bool, cudaStream_t, bool);
TANDEM_MOE_CUDA_INSTANTIATE(__nv_bfloat16)
TANDEM_MOE_CUDA_INSTANTIATE(__half)
#undef TANDEM_MOE_CUDA_INSTANTIATE

}  // namespace tandem::kernels::cuda
