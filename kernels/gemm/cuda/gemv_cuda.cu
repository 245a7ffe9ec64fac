#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/gemm/cuda/gemv_norm_stage.cuh"
#include "kernels/gemm/cuda/gemv_rope_store.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane
static_assert(kWarpsPerBlock * 32 == 256, "StageRmsNorm's block size (RmsNormKernel's)");
using gemv_internal::RopeKvStore;  // the RoPE + KV-write epilogue (kernels/fp8 too)
using gemv_internal::StageRmsNorm;

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

// What a kernel does around the product. kNormIn: `a` is the residual stream; every CTA stages
// RmsNorm(a) * norm_weight (the RmsNormKernel's arithmetic, layers_cuda.cu) in shared memory and
// multiplies that. kAddOut: out (the residual stream, T) += the rounded product.
enum class Fold { kNone, kNormIn, kAddOut };

// acc[r] += dot(8 elements of w, 8 elements of row r of a); a in shared memory when kSharedA.
template <typename T, int M, bool kSharedA = false>
__device__ __forceinline__ void Fma8(const uint4& wv, const T* a, int64_t k, int64_t col,
                                     float (&acc)[M]) {
  const T* wt = reinterpret_cast<const T*>(&wv);
  float wf[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) wf[e] = ToFloat(wt[e]);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const uint4* ap = reinterpret_cast<const uint4*>(a + r * k + col);
    const uint4 av = kSharedA ? *ap : __ldg(ap);
    const T* at = reinterpret_cast<const T*>(&av);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], ToFloat(at[e]), acc[r]);
  }
}

// A lane's first kUnroll chunks of a weight row (lane, lane + 32, ...; those below `chunks`).
__device__ __forceinline__ void LoadFirstChunks(const uint4* __restrict__ wrow, int64_t chunks,
                                                int lane, uint4 (&wv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (lane + 32 * u < chunks) wv[u] = __ldcs(wrow + lane + 32 * u);
  }
}

// acc[r] = dot(wrow, row r of a) for one weight row (k / 8 16-byte chunks), summed over the
// warp. Each lane owns the chunks lane, lane + 32, ...; kUnroll of them (or all that are left)
// are loaded before any is used so several 16-byte reads per lane are in flight. `first`
// (kFirstLoaded): the lane's first kUnroll chunks, loaded by LoadFirstChunks beforehand; they are
// added first, in the same order, so the sum is the same either way.
template <typename T, int M, bool kSharedA = false, bool kFirstLoaded = false>
__device__ __forceinline__ void WarpDot(const uint4* __restrict__ wrow, const T* a, int64_t k,
                                        int lane, float (&acc)[M], const uint4* first = nullptr) {
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const int64_t chunks = k / 8;
  int64_t c = lane;
  if constexpr (kFirstLoaded) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + 32 * u < chunks) Fma8<T, M, kSharedA>(first[u], a, k, (c + 32 * u) * 8, acc);
    }
    c += 32 * kUnroll;
  }
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Fma8<T, M, kSharedA>(wv[u], a, k, (c + 32 * u) * 8, acc);
  }
  // The rest (fewer than kUnroll chunks a lane) is loaded together too, predicated, and added in
  // the same order: the narrow tensor-parallel shapes (o_proj's k = 1024 at TP=4: 4 chunks a
  // lane, none in the loop above) no longer wait for one 16-byte load at a time.
  if (c < chunks) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + 32 * u < chunks) wv[u] = __ldcs(wrow + c + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + 32 * u < chunks) Fma8<T, M, kSharedA>(wv[u], a, k, (c + 32 * u) * 8, acc);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
}

// kRows = 1: plain linear, warp = output row `row`. kRows = 2: SiLU-and-mul, warp = output
// column `row` of [m, n]: the gate row `row`, then the up row n + `row`, each streamed exactly
// as the plain kernel streams a row (same loads in flight, same lane order of accumulation, so
// the gate and up values are bit-identical to the plain kernel's). kFold: see Fold; under
// kNormIn each warp's first weight loads are issued before the CTA stages the norm, so the
// norm's latency hides under theirs.
template <typename T, typename TOut, int M, int kRows, Fold kFold>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SmallMLinearKernel(const T* __restrict__ a, const T* __restrict__ w, const T* __restrict__ bias,
                       int64_t n, int64_t k, TOut* __restrict__ out,
                       const T* __restrict__ norm_weight, float eps) {
  static_assert(kRows == 1 || (kRows == 2 && std::is_same_v<T, TOut>));
  static_assert(kFold != Fold::kAddOut || (kRows == 1 && std::is_same_v<T, TOut>));
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const bool active = row < n;
  const uint4* wrow[kRows];
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    wrow[q] = reinterpret_cast<const uint4*>(w + (active ? row + q * n : 0) * k);
  }
  // Nothing before the wait: prefetching this warp's first weight chunks into L2 there (they
  // never depend on the predecessor) made the H200 Llama-3-8B batch-1 step ~7% slower under PDL
  // (4.60 -> 4.98 ms), so the kernel only waits, and gains the predecessor's launch latency.
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  float acc[kRows][M];
  if constexpr (kFold == Fold::kNormIn) {
    extern __shared__ uint4 gemv_smem[];  // [M, k] normalised rows, then the norm weight [k]
    T* staged = reinterpret_cast<T*>(gemv_smem);
    uint4 first[kUnroll];
    if (active) LoadFirstChunks(wrow[0], k / 8, lane, first);
    StageRmsNorm<T, M>(a, norm_weight, k, eps, staged, staged + M * k);  // every warp: barriers
    if (!active) return;
    WarpDot<T, M, true, true>(wrow[0], staged, k, lane, acc[0], first);
    if constexpr (kRows == 2) WarpDot<T, M, true>(wrow[1], staged, k, lane, acc[1]);
  } else {
    if (!active) return;
    float prev[M];  // kAddOut: the residual rows this lane adds to, read while the row streams
    if constexpr (kFold == Fold::kAddOut) {
#pragma unroll
      for (int r = 0; r < M; ++r) prev[r] = lane == 0 ? ToFloat(out[r * n + row]) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kRows; ++q) WarpDot<T, M>(wrow[q], a, k, lane, acc[q]);
    if constexpr (kFold == Fold::kAddOut) {
      if (lane != 0) return;
      const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
      // The unfused path's two roundings: the product to T (SmallMLinear), then the sum
      // (FusedAddRmsNorm's residual update).
#pragma unroll
      for (int r = 0; r < M; ++r) {
        out[r * n + row] = FromFloat<T>(prev[r] + ToFloat(FromFloat<T>(acc[0][r] + b)));
      }
      return;
    }
  }
  if (lane != 0) return;
  if constexpr (kRows == 1) {
    const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) out[r * n + row] = FromFloat<TOut>(acc[0][r] + b);
  } else {
    const float bg = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
    const float bu = bias != nullptr ? ToFloat(bias[n + row]) : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      // Round gate and up to T first, as the unfused path stores them, then SiluAndMul's
      // expression verbatim (expf, not __expf), so the result is bit-identical.
      const float g = ToFloat(FromFloat<T>(acc[0][r] + bg));
      const float u = ToFloat(FromFloat<T>(acc[1][r] + bu));
      out[r * n + row] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
    }
  }
}

// The qkv product with the input RMSNorm in its prologue (as Fold::kNormIn) and RoPE + the KV
// write in its epilogue: warp = output pair (head h, i < D / 2), streaming weight rows h * D + i
// and h * D + i + D / 2 exactly as the kNormIn kernel streams a row (same loads, same lane order:
// products bit-identical to SmallMLinearNormIn's), rounded to T, then RopeKvStore. qkv itself is
// not written.
template <typename T, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SmallMLinearNormInRopeKvKernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const T* __restrict__ bias, int64_t k,
                                   const T* __restrict__ norm_weight, float eps, GemvRopeKv rope) {
  const int lane = threadIdx.x & 31;
  const int64_t half = rope.head_dim / 2;
  const int64_t pairs = (rope.num_q_heads + 2 * rope.num_kv_heads) * half;
  const int64_t pair = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const bool active = pair < pairs;
  const int64_t row0 = active ? (pair / half) * 2 * half + pair % half : 0;
  const uint4* wrow0 = reinterpret_cast<const uint4*>(w + row0 * k);
  const uint4* wrow1 = reinterpret_cast<const uint4*>(w + (row0 + half) * k);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  extern __shared__ uint4 gemv_smem[];  // [M, k] normalised rows, then the norm weight [k]
  T* staged = reinterpret_cast<T*>(gemv_smem);
  uint4 first[kUnroll];
  if (active) LoadFirstChunks(wrow0, k / 8, lane, first);
  StageRmsNorm<T, M>(x, norm_weight, k, eps, staged, staged + M * k);  // every warp: barriers
  if (!active) return;
  float acc[2][M];
  WarpDot<T, M, true, true>(wrow0, staged, k, lane, acc[0], first);
  WarpDot<T, M, true>(wrow1, staged, k, lane, acc[1]);
  if (lane != 0) return;
  const float b1 = bias != nullptr ? ToFloat(bias[row0]) : 0.0f;
  const float b2 = bias != nullptr ? ToFloat(bias[row0 + half]) : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    RopeKvStore<T>(rope, pair, r, ToFloat(FromFloat<T>(acc[0][r] + b1)),
                   ToFloat(FromFloat<T>(acc[1][r] + b2)));
  }
}

// One launch's arguments (n: the kernel's output rows, inter for SiLU-and-mul).
template <typename T, typename TOut>
struct GemvArgs {
  const T* a;
  const T* w;
  const T* bias;
  int64_t m, n, k;
  TOut* out;
  const T* norm_weight = nullptr;  // Fold::kNormIn
  float eps = 0.0f;
};

// StageRmsNorm's warp sums, beside the dynamic shared memory below.
constexpr int64_t kNormInStaticSmemBytes = gemv_internal::kStageRmsNormStaticSmemBytes;

// Dynamic shared memory of a kNormIn launch: the staged rows and the norm weight.
int64_t NormInSmemBytes(int64_t m, int64_t k, int64_t elem_bytes) {
  return (m + 1) * k * elem_bytes;
}

template <typename T, typename TOut, int M, int kRows, Fold kFold>
cudaError_t Launch(const GemvArgs<T, TOut>& p, cudaStream_t stream, bool programmatic_launch) {
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>((p.n + kWarpsPerBlock - 1) / kWarpsPerBlock)),
      dim3(kWarpsPerBlock * 32), stream, programmatic_launch);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  if constexpr (kFold == Fold::kNormIn) {
    config.dynamicSmemBytes = static_cast<size_t>(NormInSmemBytes(M, p.k, sizeof(T)));
  }
  return cudaLaunchKernelEx(&config, SmallMLinearKernel<T, TOut, M, kRows, kFold>, p.a, p.w, p.bias,
                            p.n, p.k, p.out, p.norm_weight, p.eps);
}

// The one place where m becomes a template constant: f(std::integral_constant<int, M>()).
template <typename F>
cudaError_t WithM(int64_t m, F f) {
  switch (m) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 6:
      return f(std::integral_constant<int, 6>());
    case 7:
      return f(std::integral_constant<int, 7>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

template <typename T, typename TOut, int kRows, Fold kFold = Fold::kNone>
cudaError_t Dispatch(const GemvArgs<T, TOut>& p, cudaStream_t stream, bool pdl) {
  return WithM(p.m, [&](auto m) {
    return Launch<T, TOut, decltype(m)::value, kRows, kFold>(p, stream, pdl);
  });
}

// Checks `supported` and out, then launches: the one error message of every entry point.
template <typename T, typename TOut, int kRows, Fold kFold = Fold::kNone>
absl::Status CheckedLaunch(const char* name, bool supported, const GemvArgs<T, TOut>& p,
                           cudaStream_t stream, bool pdl) {
  if (!supported || p.out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": needs 1 <= m <= ", kGemvMaxM,
        ", n >= 1, k a positive multiple of 8, 16-byte aligned inputs, non-null out (and with "
        "the norm folded in, (m + 1) * k * 2 + 32 bytes <= ",
        kGemvNormInMaxSmemBytes, "); got m=", p.m, " n=", p.n, " k=", p.k));
  }
  CUDA_RETURN_IF_ERROR((Dispatch<T, TOut, kRows, kFold>(p, stream, pdl)));
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && a != nullptr &&
         w != nullptr && Aligned16(a) && Aligned16(w) && n <= (int64_t{1} << 31) * kWarpsPerBlock;
}

bool SmallMLinearNormInSupported(const void* x, const void* norm_weight, const void* w, int64_t m,
                                 int64_t n, int64_t k) {
  return SmallMLinearSupported(x, w, m, n, k) && norm_weight != nullptr && Aligned16(norm_weight) &&
         NormInSmemBytes(m, k, 2) + kNormInStaticSmemBytes <= kGemvNormInMaxSmemBytes;
}

template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream, bool programmatic_launch) {
  return CheckedLaunch<T, TOut, 1>("SmallMLinear", SmallMLinearSupported(a, w, m, n, k),
                                   {a, w, bias, m, n, k, out}, stream, programmatic_launch);
}

template <typename T>
absl::Status SmallMLinearSiluMul(const T* a, const T* w, const T* bias, int64_t m, int64_t inter,
                                 int64_t k, T* out, cudaStream_t stream, bool programmatic_launch) {
  return CheckedLaunch<T, T, 2>("SmallMLinearSiluMul",
                                inter >= 1 && SmallMLinearSupported(a, w, m, 2 * inter, k),
                                {a, w, bias, m, inter, k, out}, stream, programmatic_launch);
}

template <typename T>
absl::Status SmallMLinearNormIn(const T* x, const T* norm_weight, float eps, const T* w,
                                const T* bias, int64_t m, int64_t n, int64_t k, T* out,
                                cudaStream_t stream, bool programmatic_launch) {
  return CheckedLaunch<T, T, 1, Fold::kNormIn>(
      "SmallMLinearNormIn", SmallMLinearNormInSupported(x, norm_weight, w, m, n, k),
      {x, w, bias, m, n, k, out, norm_weight, eps}, stream, programmatic_launch);
}

template <typename T>
absl::Status SmallMLinearNormInSiluMul(const T* x, const T* norm_weight, float eps, const T* w,
                                       const T* bias, int64_t m, int64_t inter, int64_t k, T* out,
                                       cudaStream_t stream, bool programmatic_launch) {
  return CheckedLaunch<T, T, 2, Fold::kNormIn>(
      "SmallMLinearNormInSiluMul",
      inter >= 1 && SmallMLinearNormInSupported(x, norm_weight, w, m, 2 * inter, k),
      {x, w, bias, m, inter, k, out, norm_weight, eps}, stream, programmatic_launch);
}

template <typename T>
absl::Status SmallMLinearAddTo(const T* a, const T* w, const T* bias, int64_t m, int64_t n,
                               int64_t k, T* residual, cudaStream_t stream,
                               bool programmatic_launch) {
  return CheckedLaunch<T, T, 1, Fold::kAddOut>(
      "SmallMLinearAddTo", SmallMLinearSupported(a, w, m, n, k), {a, w, bias, m, n, k, residual},
      stream, programmatic_launch);
}

bool SmallMLinearNormInRopeKvSupported(const void* x, const void* norm_weight, const void* w,
                                       int64_t m, int64_t k, const GemvRopeKv& rope) {
  const int64_t width = (rope.num_q_heads + 2 * rope.num_kv_heads) * rope.head_dim;
  return rope.head_dim >= 2 && rope.head_dim % 2 == 0 && rope.num_q_heads >= 1 &&
         rope.num_kv_heads >= 1 && rope.positions != nullptr && rope.slot_mapping != nullptr &&
         rope.inv_freq != nullptr && rope.q_out != nullptr && rope.pool != nullptr &&
         rope.block_size >= 1 && SmallMLinearNormInSupported(x, norm_weight, w, m, width, k);
}

template <typename T>
absl::Status SmallMLinearNormInRopeKv(const T* x, const T* norm_weight, float eps, const T* w,
                                      const T* bias, int64_t m, int64_t k, const GemvRopeKv& rope,
                                      cudaStream_t stream, bool programmatic_launch) {
  if (!SmallMLinearNormInRopeKvSupported(x, norm_weight, w, m, k, rope)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SmallMLinearNormInRopeKv: needs SmallMLinearNormInSupported for the qkv width, an even "
        "head_dim, heads >= 1 and non-null rope / pool pointers; got m=",
        m, " k=", k, " head_dim=", rope.head_dim));
  }
  const int64_t pairs = (rope.num_q_heads + 2 * rope.num_kv_heads) * (rope.head_dim / 2);
  CUDA_RETURN_IF_ERROR(WithM(m, [&](auto mc) {
    const internal::PdlLaunchConfig pdl_config(
        dim3(static_cast<unsigned>((pairs + kWarpsPerBlock - 1) / kWarpsPerBlock)),
        dim3(kWarpsPerBlock * 32), stream, programmatic_launch);
    cudaLaunchConfig_t config = *pdl_config.get();
    config.dynamicSmemBytes = static_cast<size_t>(NormInSmemBytes(decltype(mc)::value, k, 2));
    return cudaLaunchKernelEx(&config, SmallMLinearNormInRopeKvKernel<T, decltype(mc)::value>, x, w,
                              bias, k, norm_weight, eps, rope);
  }));
  return absl::OkStatus();
}

#define TANDEM_GEMV_CUDA_INSTANTIATE(T, TOut)                                                 \
  template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t, int64_t, \
                                              int64_t, TOut*, cudaStream_t, bool);
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_INSTANTIATE(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, __half)
TANDEM_GEMV_CUDA_INSTANTIATE(__half, float)
#undef TANDEM_GEMV_CUDA_INSTANTIATE
template absl::Status SmallMLinearSiluMul<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, int64_t, int64_t,
                                                         int64_t, __nv_bfloat16*, cudaStream_t,
                                                         bool);
template absl::Status SmallMLinearSiluMul<__half>(const __half*, const __half*, const __half*,
                                                  int64_t, int64_t, int64_t, __half*, cudaStream_t,
                                                  bool);
#define TANDEM_GEMV_FOLD_INSTANTIATE(T)                                                            \
  template absl::Status SmallMLinearNormIn<T>(const T*, const T*, float, const T*, const T*,       \
                                              int64_t, int64_t, int64_t, T*, cudaStream_t, bool);  \
  template absl::Status SmallMLinearNormInSiluMul<T>(const T*, const T*, float, const T*,          \
                                                     const T*, int64_t, int64_t, int64_t, T*,      \
                                                     cudaStream_t, bool);                          \
  template absl::Status SmallMLinearAddTo<T>(const T*, const T*, const T*, int64_t, int64_t,       \
                                             int64_t, T*, cudaStream_t, bool);                     \
  template absl::Status SmallMLinearNormInRopeKv<T>(const T*, const T*, float, const T*, const T*, \
                                                    int64_t, int64_t, const GemvRopeKv&,           \
                                                    cudaStream_t, bool);
TANDEM_GEMV_FOLD_INSTANTIATE(__nv_bfloat16)
TANDEM_GEMV_FOLD_INSTANTIATE(__half)
#undef TANDEM_GEMV_FOLD_INSTANTIATE

}  // namespace tandem::kernels::cuda
