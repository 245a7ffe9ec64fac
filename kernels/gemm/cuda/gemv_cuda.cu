#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::kernels::cuda {
namespace {

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

// Loads the weight chunks c, c + stride, ..., c + (kUnroll - 1) * stride of a row that exist
// (fewer than kUnroll near the row's end), 16 bytes each, evict-first.
__device__ __forceinline__ void LoadBatch(const uint4* __restrict__ wrow, int64_t c, int64_t stride,
                                          int64_t chunks, uint4 (&wv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (c + stride * u < chunks) wv[u] = __ldcs(wrow + c + stride * u);
  }
}

// acc[r] = dot(wrow, row r of a) over the chunks c0, c0 + stride, ... of the row (k / 8 16-byte
// chunks), summed over the warp. Lane l of a warp owns the chunks c0 + l' with l' = l, l + stride,
// ... (stride 32 when one warp owns the row; 32 * split when `split` warps share it, c0 = 32 *
// part + lane). The warp streams kUnroll chunks a lane at a time, all loaded before any is used,
// the first batch already in `wv` (LoadBatch: early_weight_loads issues it before the PDL wait),
// and adds them in chunk order; a batch near the row's end is predicated. With stride 32 the sum
// is the one the kernel always computed (bit-identical results).
template <typename T, int M>
__device__ __forceinline__ void WarpDot(const uint4* __restrict__ wrow, const T* a, int64_t k,
                                        int64_t c0, int64_t stride, uint4 (&wv)[kUnroll],
                                        float (&acc)[M]) {
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const int64_t chunks = k / 8;
  for (int64_t c = c0; c < chunks;) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + stride * u < chunks) Fma8<T, M>(wv[u], a, k, (c + stride * u) * 8, acc);
    }
    c += stride * kUnroll;
    LoadBatch(wrow, c, stride, chunks, wv);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
}

// The rows' sums when `split` warps of the block share a row: each warp's part through shared
// memory, added in part order by the row's first warp (part 0), whose acc then holds the row's.
template <int M, int kRows>
__device__ __forceinline__ void SumParts(int warp, int part, int split, int lane,
                                         float (&acc)[kRows][M]) {
  __shared__ float parts[kGemvWarpsPerBlock][kRows][M];
  if (lane == 0) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
#pragma unroll
      for (int r = 0; r < M; ++r) parts[warp][q][r] = acc[q][r];
    }
  }
  __syncthreads();
  if (part != 0) return;
  for (int p = 1; p < split; ++p) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
#pragma unroll
      for (int r = 0; r < M; ++r) acc[q][r] += parts[warp + p][q][r];
    }
  }
}

// What the kernel computes per output.
enum Mode : int {
  kPlain = 0,    // out[r, row] = a[r] . w[row] (+ bias)
  kSiluMul = 1,  // out[r, row] = silu(gate row `row`) * (up row n + `row`)
  kRopeKv = 2,   // rows (h * D + i, h * D + i + D / 2) of qkv, rotated / copied to q or the pool
};

template <int kMode>
inline constexpr int kRowsOf = kMode == kPlain ? 1 : 2;

// The weight row of the q-th product of output `row` (Mode).
template <int kMode>
__device__ __forceinline__ int64_t WeightRow(int64_t row, int q, int64_t n, int half) {
  if constexpr (kMode == kRopeKv) return (row / half) * 2 * half + row % half + q * half;
  return row + q * n;
}

// RoPE + KV write of output pair `row` = (head h, element i < D / 2) for token r: the same
// rounding and rotation as GEMV into qkv + RopeQkvToCache (kernels/attention/cuda): the products
// are rounded to T (as qkv stores them), q and k rotated in fp32 (sincosf), v copied.
template <typename T>
__device__ __forceinline__ void RopeKvStore(const GemvRopeKv& d, int64_t row, int r, float x1,
                                            float x2) {
  const int half = static_cast<int>(d.head_dim / 2);
  const int64_t h = row / half;
  const int i = static_cast<int>(row % half);
  T* dst;
  int kv = -1;
  if (h < d.num_q_heads) {
    dst = static_cast<T*>(d.q_out) + (r * d.num_q_heads + h) * d.head_dim;
  } else {
    const int64_t slot = d.slot_mapping[r];
    if (slot < 0 || slot >= d.num_slots) return;
    kv = h < d.num_q_heads + d.num_kv_heads ? 0 : 1;
    const int64_t kv_head = h - d.num_q_heads - kv * d.num_kv_heads;
    dst = static_cast<T*>(d.pool) + (slot / d.block_size) * d.block_stride + d.layer_tile_offset +
          kv * d.kv_stride + ((slot % d.block_size) * d.num_kv_heads + kv_head) * d.head_dim;
  }
  if (kv == 1) {
    dst[i] = FromFloat<T>(x1);
    dst[i + half] = FromFloat<T>(x2);
    return;
  }
  float s, c;
  sincosf(static_cast<float>(d.positions[r]) * d.inv_freq[i], &s, &c);
  dst[i] = FromFloat<T>(x1 * c + (-x2) * s);
  dst[i + half] = FromFloat<T>(x2 * c + x1 * s);
}

// kPlain: output row `row`. kSiluMul: output column `row` of [m, n]: the gate row `row`, then
// the up row n + `row`. kRopeKv: output pair `row` of n = qkv width / 2 (WeightRow). Each weight
// row is streamed exactly as the plain kernel streams a row (same loads in flight, same lane
// order of accumulation, so the products are bit-identical to the plain kernel's with the same
// split). `split` (1, 2, 4 or 8) warps of a block share an output, each a 1 / split of its chunks
// (split-k inside the block: more warps and loads in flight for narrow n; the parts meet in shared
// memory, no atomics). early: the warp's first kUnroll weight chunks (of its first row) are loaded
// before the PDL wait; weights are never written by a preceding kernel.
template <typename T, typename TOut, int M, int kMode>
__global__ void __launch_bounds__(kGemvWarpsPerBlock * 32)
    SmallMLinearKernel(const T* __restrict__ a, const T* __restrict__ w, const T* __restrict__ bias,
                       int64_t n, int64_t k, TOut* __restrict__ out, int split, bool early,
                       GemvRopeKv rope) {
  constexpr int kRows = kRowsOf<kMode>;
  static_assert(kMode == kPlain || std::is_same_v<T, TOut>);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int part = warp % split;
  const int64_t row = int64_t{blockIdx.x} * (kGemvWarpsPerBlock / split) + warp / split;
  const bool active = row < n;
  const int half = static_cast<int>(rope.head_dim / 2);
  const int64_t stride = 32 * int64_t{split}, c0 = 32 * int64_t{part} + lane;
  const uint4* wrow[kRows];
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    wrow[q] =
        reinterpret_cast<const uint4*>(w + (active ? WeightRow<kMode>(row, q, n, half) : 0) * k);
  }
  uint4 wv[kUnroll];
  if (early && active) LoadBatch(wrow[0], c0, stride, k / 8, wv);
  // Without `early` nothing is read before the wait: prefetching this warp's first weight chunks
  // into L2 there made the H200 Llama-3-8B batch-1 step ~7% slower under PDL (4.60 -> 4.98 ms).
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!early && active) LoadBatch(wrow[0], c0, stride, k / 8, wv);
  float acc[kRows][M];
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    if (q > 0 && active) LoadBatch(wrow[q], c0, stride, k / 8, wv);
    if (active) WarpDot<T, M>(wrow[q], a, k, c0, stride, wv, acc[q]);
  }
  if (split > 1) SumParts<M, kRows>(warp, part, split, lane, acc);
  if (!active || part != 0 || lane != 0) return;
  if constexpr (kMode == kPlain) {
    const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) out[r * n + row] = FromFloat<TOut>(acc[0][r] + b);
  } else {
    const int64_t r0 = WeightRow<kMode>(row, 0, n, half), r1 = WeightRow<kMode>(row, 1, n, half);
    const float b0 = bias != nullptr ? ToFloat(bias[r0]) : 0.0f;
    const float b1 = bias != nullptr ? ToFloat(bias[r1]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      // Rounded to T first, as the unfused path stores the products.
      const float x0 = ToFloat(FromFloat<T>(acc[0][r] + b0));
      const float x1 = ToFloat(FromFloat<T>(acc[1][r] + b1));
      if constexpr (kMode == kSiluMul) {
        // SiluAndMul's expression verbatim (expf, not __expf), so the result is bit-identical.
        out[r * n + row] = FromFloat<T>(x0 / (1.0f + expf(-x0)) * x1);
      } else {
        RopeKvStore<T>(rope, row, r, x0, x1);
      }
    }
  }
}

template <typename T, typename TOut, int M, int kMode>
cudaError_t Launch(const T* a, const T* w, const T* bias, int64_t n, int64_t k, TOut* out,
                   cudaStream_t stream, bool programmatic_launch, const GemvTuning& tuning,
                   const GemvRopeKv& rope) {
  const int split = GemvSplit(n, k, tuning);
  const int64_t rows_per_block = kGemvWarpsPerBlock / split;
  const internal::PdlLaunchConfig config(
      dim3(static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block)),
      dim3(kGemvWarpsPerBlock * 32), stream, programmatic_launch);
  return cudaLaunchKernelEx(config.get(), SmallMLinearKernel<T, TOut, M, kMode>, a, w, bias, n, k,
                            out, split, tuning.early_weight_loads, rope);
}

// The one place where m becomes a template constant.
template <typename T, typename TOut, int kMode>
cudaError_t Dispatch(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                     TOut* out, cudaStream_t stream, bool pdl, const GemvTuning& t,
                     const GemvRopeKv& rope = {}) {
  switch (m) {
    case 1:
      return Launch<T, TOut, 1, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 2:
      return Launch<T, TOut, 2, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 3:
      return Launch<T, TOut, 3, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 4:
      return Launch<T, TOut, 4, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 5:
      return Launch<T, TOut, 5, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 6:
      return Launch<T, TOut, 6, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    case 7:
      return Launch<T, TOut, 7, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
    default:
      return Launch<T, TOut, 8, kMode>(a, w, bias, n, k, out, stream, pdl, t, rope);
  }
}

}  // namespace

bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && a != nullptr &&
         w != nullptr && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && n < (int64_t{1} << 31);
}

template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream, bool programmatic_launch,
                          const GemvTuning& tuning) {
  if (!SmallMLinearSupported(a, w, m, n, k) || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("SmallMLinear: needs 1 <= m <= ", kGemvMaxM,
                                                   ", n >= 1, k a positive multiple of 8, "
                                                   "16-byte aligned a/w and non-null out; got m=",
                                                   m, " n=", n, " k=", k));
  }
  CUDA_RETURN_IF_ERROR(
      (Dispatch<T, TOut, kPlain>(a, w, bias, m, n, k, out, stream, programmatic_launch, tuning)));
  return absl::OkStatus();
}

template <typename T>
absl::Status SmallMLinearSiluMul(const T* a, const T* w, const T* bias, int64_t m, int64_t inter,
                                 int64_t k, T* out, cudaStream_t stream, bool programmatic_launch,
                                 const GemvTuning& tuning) {
  if (inter < 1 || !SmallMLinearSupported(a, w, m, 2 * inter, k) || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SmallMLinearSiluMul: needs 1 <= m <= ", kGemvMaxM,
                     ", inter >= 1, k a positive multiple of 8, 16-byte aligned a/w and non-null "
                     "out; got m=",
                     m, " inter=", inter, " k=", k));
  }
  CUDA_RETURN_IF_ERROR((
      Dispatch<T, T, kSiluMul>(a, w, bias, m, inter, k, out, stream, programmatic_launch, tuning)));
  return absl::OkStatus();
}

template <typename T>
absl::Status SmallMLinearRopeKv(const T* a, const T* w, const T* bias, int64_t m, int64_t k,
                                const GemvRopeKv& dst, cudaStream_t stream,
                                bool programmatic_launch, const GemvTuning& tuning) {
  const int64_t D = dst.head_dim, width = (dst.num_q_heads + 2 * dst.num_kv_heads) * D;
  if (D < 2 || D % 2 != 0 || dst.num_q_heads < 1 || dst.num_kv_heads < 1 ||
      !SmallMLinearSupported(a, w, m, width, k) || dst.positions == nullptr ||
      dst.slot_mapping == nullptr || dst.inv_freq == nullptr || dst.q_out == nullptr ||
      dst.pool == nullptr || dst.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SmallMLinearRopeKv: needs 1 <= m <= ", kGemvMaxM,
                     ", an even head_dim, q and kv heads, k a positive multiple of 8, 16-byte "
                     "aligned a/w and non-null positions / slots / inv_freq / q_out / pool; got m=",
                     m, " head_dim=", D, " k=", k));
  }
  CUDA_RETURN_IF_ERROR(
      (Dispatch<T, T, kRopeKv>(a, w, bias, m, width / 2, k, static_cast<T*>(nullptr), stream,
                               programmatic_launch, tuning, dst)));
  return absl::OkStatus();
}

#define TANDEM_GEMV_CUDA_INSTANTIATE(T, TOut)                                                 \
  template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t, int64_t, \
                                              int64_t, TOut*, cudaStream_t, bool,             \
                                              const GemvTuning&);
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, __half)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, float)
#undef TANDEM_GEMV_CUDA_INSTANTIATE
template absl::Status SmallMLinearSiluMul<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, int64_t, int64_t,
                                                         int64_t, __nv_bfloat16*, cudaStream_t,
                                                         bool, const GemvTuning&);
template absl::Status SmallMLinearSiluMul<__half>(const __half*, const __half*, const __half*,
                                                  int64_t, int64_t, int64_t, __half*, cudaStream_t,
                                                  bool, const GemvTuning&);

template absl::Status SmallMLinearRopeKv<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, int64_t, int64_t,
                                                        const GemvRopeKv&, cudaStream_t, bool,
                                                        const GemvTuning&);
template absl::Status SmallMLinearRopeKv<__half>(const __half*, const __half*, const __half*,
                                                 int64_t, int64_t, const GemvRopeKv&, cudaStream_t,
                                                 bool, const GemvTuning&);

}  // namespace tandem::kernels::cuda
