#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::Vec;
using internal::VecToFloat;

constexpr int kGroup = 128;
constexpr int kQuantThreads = 256;
constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ uint8_t ToE4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float ToF32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF32(float x) { return x; }

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Scale amax / 448, 1 for an all-zero row, group or tile (the CPU's ScaleFor).
__device__ __forceinline__ float ScaleFor(float amax) {
  return amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
}

// The max of `v` over the kQuantThreads threads of the block, in every thread. Called once per
// kernel by all its threads (its shared slots are not guarded for reuse).
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_max[kQuantThreads / 32];
  v = WarpMax(v);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0.0f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
  return v;
}

// One block per token row. Per-token: the block's amax; groups: each warp takes groups of 128
// columns (4 per lane). Static: the given scale. Scales are amax / 448 (1 for zeros), values
// divided by their scale (IEEE division, as the CPU reference), rounded to nearest even with
// saturation.
template <typename TIn>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeKernel(const TIn* __restrict__ x, int64_t k, int scheme, float static_scale,
                   uint8_t* __restrict__ codes, float* __restrict__ scales,
                   int64_t group_major_ld) {
  internal::WaitForPrecedingGrid();  // PDL (programmatic_launch): x is the predecessor's output
  internal::AllowDependentLaunch();
  const int64_t row = blockIdx.x;
  const TIn* xr = x + row * k;
  uint8_t* cr = codes + row * k;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (scheme == static_cast<int>(Fp8ActivationScheme::kDynamicGroup128)) {
    const int64_t groups = (k + kGroup - 1) / kGroup;
    for (int64_t g = warp; g < groups; g += kQuantThreads / 32) {
      const int64_t c0 = g * kGroup;
      float amax = 0.0f;
      for (int64_t c = c0 + lane; c < c0 + kGroup && c < k; c += 32) {
        amax = fmaxf(amax, fabsf(ToF32(xr[c])));
      }
      amax = WarpMax(amax);
      const float scale = ScaleFor(amax);
      if (lane == 0) scales[Fp8GroupScaleIndex(row, g, groups, group_major_ld)] = scale;
      for (int64_t c = c0 + lane; c < c0 + kGroup && c < k; c += 32) {
        cr[c] = ToE4m3(ToF32(xr[c]) / scale);
      }
    }
    return;
  }
  float scale = static_scale;
  if (scheme == static_cast<int>(Fp8ActivationScheme::kDynamicToken)) {
    float amax = 0.0f;
    for (int64_t c = tid; c < k; c += kQuantThreads) {
      amax = fmaxf(amax, fabsf(ToF32(xr[c])));
    }
    scale = ScaleFor(BlockMax(amax));
    if (tid == 0) scales[row] = scale;
  } else if (row == 0 && tid == 0) {
    scales[0] = static_scale;
  }
  for (int64_t c = tid; c < k; c += kQuantThreads) cr[c] = ToE4m3(ToF32(xr[c]) / scale);
}

// One block per 128 x 128 tile (blockIdx.x: column group, blockIdx.y: row block): the tile's
// amax, scale amax / 448 (1 for zeros), the codes, then the scale per row (and in the block
// layout).
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeTilesKernel(const float* __restrict__ w, int64_t n, int64_t k,
                        uint8_t* __restrict__ codes, float* __restrict__ row_scales,
                        float* __restrict__ block_scales, int64_t block_ld) {
  const int64_t groups = (k + kGroup - 1) / kGroup;
  const int64_t g = blockIdx.x, r0 = int64_t{blockIdx.y} * kGroup, c0 = g * kGroup;
  const int rows = static_cast<int>(n - r0 < kGroup ? n - r0 : kGroup);
  const int cols = static_cast<int>(k - c0 < kGroup ? k - c0 : kGroup);
  const int tid = threadIdx.x;
  float amax = 0.0f;
  for (int i = tid; i < rows * kGroup; i += kQuantThreads) {
    const int r = i / kGroup, c = i % kGroup;
    if (c < cols) amax = fmaxf(amax, fabsf(w[(r0 + r) * k + c0 + c]));
  }
  const float scale = ScaleFor(BlockMax(amax));
  for (int i = tid; i < rows * kGroup; i += kQuantThreads) {
    const int r = i / kGroup, c = i % kGroup;
    if (c < cols) codes[(r0 + r) * k + c0 + c] = ToE4m3(w[(r0 + r) * k + c0 + c] / scale);
  }
  for (int r = tid; r < rows; r += kQuantThreads) row_scales[(r0 + r) * groups + g] = scale;
  if (block_scales != nullptr && tid == 0) {
    float* row = block_scales + blockIdx.y * block_ld;
    row[g] = scale;
    if (g == groups - 1) {
      for (int64_t j = groups; j < block_ld; ++j) row[j] = 1.0f;  // padding
    }
  }
}

__global__ void DequantizeKernel(const uint8_t* __restrict__ codes,
                                 const float* __restrict__ scales, int64_t n, int64_t k,
                                 int64_t groups, int64_t block_cols,
                                 __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * k;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(codes[i]), __NV_E4M3));
    out[i] = __float2bfloat16_rn(__half2float(h) * scales[r * groups + c / block_cols]);
  }
}

// Per-token or static quantization of bf16 rows with k % 8 == 0: 16-byte loads, the row's
// values kept in registers between the amax and the quantization (up to kVecPerThread vectors
// per thread: k <= 16384), 8-byte code stores. The same codes and scales as QuantizeKernel (max
// is exact in any order; the same division and rounding per element).
constexpr int kVecPerThread = 8;
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsVec8Kernel(const __nv_bfloat16* __restrict__ x, int64_t k, int scheme,
                           float static_scale, uint8_t* __restrict__ codes,
                           float* __restrict__ scales) {
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  const int64_t row = blockIdx.x, vecs = k / 8;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * k);
  const int tid = threadIdx.x;
  uint4 v[kVecPerThread];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecPerThread; ++i) {
    const int64_t c = tid + int64_t{i} * kQuantThreads;
    v[i] = c < vecs ? __ldg(xr + c) : make_uint4(0, 0, 0, 0);
    float f[8];
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v[i]), f);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
  }
  float scale = static_scale;
  if (scheme == static_cast<int>(Fp8ActivationScheme::kDynamicToken)) {
    scale = ScaleFor(BlockMax(amax));
    if (tid == 0) scales[row] = scale;
  } else if (row == 0 && tid == 0) {
    scales[0] = static_scale;
  }
  uint2* cr = reinterpret_cast<uint2*>(codes + row * k);
#pragma unroll
  for (int i = 0; i < kVecPerThread; ++i) {
    const int64_t c = tid + int64_t{i} * kQuantThreads;
    if (c >= vecs) break;
    float f[8];
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v[i]), f);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e / 4] |= uint32_t{ToE4m3(f[e] / scale)} << (8 * (e % 4));
    cr[c] = make_uint2(w[0], w[1]);
  }
}

// kDynamicGroup128 on bf16 rows with k % 8 == 0: a warp per two groups of 128 columns of a row,
// a half-warp per group, one 16-byte load of 8 values a lane, the group's amax by shuffles within
// the half-warp, 8-byte code stores (a last partial group: its lanes past k hold 0). The same codes
// and scales as QuantizeKernel's group path (max is exact in any order; the same division and
// rounding per element), which takes a warp per group with 2-byte loads and 1-byte stores.
constexpr int kGroupsPerWarp = 2;
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeGroupsVec8Kernel(const __nv_bfloat16* __restrict__ x, int64_t m, int64_t k,
                             uint8_t* __restrict__ codes, float* __restrict__ scales,
                             int64_t group_major_ld) {
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  const int64_t groups = (k + kGroup - 1) / kGroup;
  const int64_t tasks_per_row = (groups + kGroupsPerWarp - 1) / kGroupsPerWarp;
  const int64_t task = int64_t{blockIdx.x} * (kQuantThreads / 32) + (threadIdx.x >> 5);
  if (task >= m * tasks_per_row) return;  // whole warps: the shuffles below see full warps
  const int lane = threadIdx.x & 31;
  const int64_t row = task / tasks_per_row;
  const int64_t g = task % tasks_per_row * kGroupsPerWarp + (lane >> 4);
  const int64_t c = g * kGroup + (lane & 15) * 8;  // this lane's 8 columns (k % 8 == 0)
  const bool valid = g < groups && c < k;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (valid) v = __ldg(reinterpret_cast<const uint4*>(x + row * k + c));
  float f[8];
  VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v), f);
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  const float scale = ScaleFor(amax);
  if (g < groups && (lane & 15) == 0) {
    scales[Fp8GroupScaleIndex(row, g, groups, group_major_ld)] = scale;
  }
  if (!valid) return;
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < 8; ++e) w[e / 4] |= uint32_t{ToE4m3(f[e] / scale)} << (8 * (e % 4));
  *reinterpret_cast<uint2*>(codes + row * k + c) = make_uint2(w[0], w[1]);
}

struct GemvParams {
  const uint8_t* a_codes;
  const __nv_bfloat16* a_values;
  const float* a_scales;
  int64_t a_scale_row_stride;  // 0 static, 1 per-token, groups per row for 1x128
  int64_t a_group;             // columns per activation scale (k or 128)
  const uint8_t* w_codes;
  const float* w_scales;
  int64_t w_groups;      // scales per weight row
  int64_t w_block_cols;  // columns per weight scale (k or 128)
  const __nv_bfloat16* bias;
  int64_t m, n, k;
};

// The 16 activations of row r at column col, as floats.
template <bool kFp8Act>
__device__ __forceinline__ void LoadActivations(const GemvParams& p, int r, int64_t col,
                                                float (&af)[16]) {
  if constexpr (kFp8Act) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.a_codes + r * p.k + col));
    VecToFloat(*reinterpret_cast<const Vec<__nv_fp8_e4m3, 16>*>(&v), af);
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(p.a_values + r * p.k + col);
    const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v0), af);
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v1), af + 8);
  }
}

// acc[r] += (w chunk . a chunk of row r) * w_scale * a_scale for one 16-column chunk.
template <bool kFp8Act, int M>
__device__ __forceinline__ void Chunk(const GemvParams& p, const uint4& wv, const float* wscale_row,
                                      int64_t col, float (&acc)[M]) {
  float wf[16];
  VecToFloat(*reinterpret_cast<const Vec<__nv_fp8_e4m3, 16>*>(&wv), wf);
  const float ws = wscale_row[col / p.w_block_cols];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= p.m) break;  // M is m rounded up to a power of two
    float af[16];
    LoadActivations<kFp8Act>(p, r, col, af);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) dot = fmaf(wf[e], af[e], dot);
    float scale = ws;
    if constexpr (kFp8Act) {
      scale *= p.a_scales[r * p.a_scale_row_stride + col / p.a_group];
    }
    acc[r] = fmaf(dot, scale, acc[r]);
  }
}

template <bool kFp8Act, typename TOut, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    Fp8GemvKernel(const __grid_constant__ GemvParams p, TOut* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.n) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(p.w_codes + row * p.k);
  const float* wscale_row = p.w_scales + row * p.w_groups;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const int64_t chunks = p.k / 16;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Chunk<kFp8Act, M>(p, wv[u], wscale_row, (c + 32 * u) * 16, acc);
    }
  }
  for (; c < chunks; c += 32) Chunk<kFp8Act, M>(p, __ldcs(wrow + c), wscale_row, c * 16, acc);
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if (lane != 0) return;
  const float b = p.bias != nullptr ? __bfloat162float(p.bias[row]) : 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r < p.m) out[r * p.n + row] = internal::FromFloat<TOut>(acc[r] + b);
  }
}

template <bool kFp8Act, typename TOut, int M>
cudaError_t Launch(const GemvParams& p, TOut* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.n + kWarpsPerBlock - 1) / kWarpsPerBlock));
  Fp8GemvKernel<kFp8Act, TOut, M><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p, out);
  return cudaGetLastError();
}

// The one place where m becomes a template constant: m rounded up to 1, 2, 4, 8 or 16 (the
// kernel skips rows past p.m).
template <bool kFp8Act, typename TOut>
cudaError_t Dispatch(const GemvParams& p, TOut* out, cudaStream_t stream) {
  if (p.m <= 1) return Launch<kFp8Act, TOut, 1>(p, out, stream);
  if (p.m <= 2) return Launch<kFp8Act, TOut, 2>(p, out, stream);
  if (p.m <= 4) return Launch<kFp8Act, TOut, 4>(p, out, stream);
  if (p.m <= 8) return Launch<kFp8Act, TOut, 8>(p, out, stream);
  return Launch<kFp8Act, TOut, 16>(p, out, stream);
}

__global__ void AddBiasKernel(__nv_bfloat16* __restrict__ out,
                              const __nv_bfloat16* __restrict__ bias, int64_t m, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(bias[i % n]));
  }
}

// Four consecutive outputs per thread (n % 4 == 0, 16-byte aligned acc, 8-byte aligned out):
// one float4 load, one 8-byte store; grid-stride over the m * n / 4 quads.
__global__ void ScaleAccumulatorVec4Kernel(const float4* __restrict__ acc,
                                           const float* __restrict__ a_scales,
                                           const float* __restrict__ w_scales,
                                           const __nv_bfloat16* __restrict__ bias, int64_t m,
                                           int64_t n, __nv_bfloat162* __restrict__ out) {
  const int64_t quads = m * n / 4;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < quads;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = q * 4 / n, j = q * 4 % n;
    const float4 v = acc[q];
    const float as = a_scales[i];
    float r[4] = {v.x * as * w_scales[j], v.y * as * w_scales[j + 1], v.z * as * w_scales[j + 2],
                  v.w * as * w_scales[j + 3]};
    if (bias != nullptr) {
#pragma unroll
      for (int t = 0; t < 4; ++t) r[t] += __bfloat162float(bias[j + t]);
    }
    out[2 * q] = __floats2bfloat162_rn(r[0], r[1]);
    out[2 * q + 1] = __floats2bfloat162_rn(r[2], r[3]);
  }
}

__global__ void ScaleAccumulatorKernel(const float* __restrict__ acc,
                                       const float* __restrict__ a_scales,
                                       const float* __restrict__ w_scales,
                                       const __nv_bfloat16* __restrict__ bias, int64_t m, int64_t n,
                                       __nv_bfloat16* __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < m * n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    float r = acc[e] * a_scales[i] * w_scales[j];
    if (bias != nullptr) r += __bfloat162float(bias[j]);
    out[e] = __float2bfloat16_rn(r);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status ScaleFp8Accumulator(const float* acc, const float* a_scales, const float* w_scales,
                                 const __nv_bfloat16* bias, int64_t m, int64_t n,
                                 __nv_bfloat16* out, cudaStream_t stream) {
  if (acc == nullptr || a_scales == nullptr || w_scales == nullptr || out == nullptr || m < 0 ||
      n < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ScaleFp8Accumulator: needs non-null buffers, m >= 0 and n >= 1; got m=", m, " n=", n));
  }
  if (m == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 132 * 16;  // enough to cover an H200's SMs several times
  const bool vec = n % 4 == 0 && Aligned16(acc) && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t items = vec ? m * n / 4 : m * n;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks));
  if (vec) {
    ScaleAccumulatorVec4Kernel<<<blocks, kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(acc), a_scales, w_scales, bias, m, n,
        reinterpret_cast<__nv_bfloat162*>(out));
  } else {
    ScaleAccumulatorKernel<<<blocks, kThreads, 0, stream>>>(acc, a_scales, w_scales, bias, m, n,
                                                            out);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// QuantizeGroupsVec8Kernel unless TANDEM_FP8_QUANT_VEC_GROUPS=0 (read once: A/B runs against
// QuantizeKernel's group path, the same bits).
bool VecGroupsOn() {
  static const bool on = [] {
    const char* env = std::getenv("TANDEM_FP8_QUANT_VEC_GROUPS");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

template <typename TIn>
absl::Status QuantizeActivationsT(const TIn* x, int64_t m, int64_t k, Fp8ActivationScheme scheme,
                                  float static_scale, uint8_t* codes, float* scales,
                                  cudaStream_t stream, bool programmatic_launch,
                                  int64_t group_major_ld) {
  if (scheme == Fp8ActivationScheme::kNone || m < 1 || k < 1 || x == nullptr || codes == nullptr ||
      scales == nullptr ||
      (scheme == Fp8ActivationScheme::kStaticTensor && !(static_scale > 0.0f))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeActivations: needs a quantizing scheme, m, k >= 1, non-null buffers and a "
        "positive static scale; got m=",
        m, " k=", k, " scheme=", static_cast<int>(scheme)));
  }
  if (group_major_ld != 0 &&
      (scheme != Fp8ActivationScheme::kDynamicGroup128 || group_major_ld < m)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeActivations: group-major scales need kDynamicGroup128 and an ld >= m; got ld=",
        group_major_ld, " m=", m, " scheme=", static_cast<int>(scheme)));
  }
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(m)), dim3(kQuantThreads),
                                         stream, programmatic_launch);
  if constexpr (std::is_same_v<TIn, __nv_bfloat16>) {
    if (scheme != Fp8ActivationScheme::kDynamicGroup128 && k % 8 == 0 &&
        k <= int64_t{8} * kVecPerThread * kQuantThreads && Aligned16(x) &&
        reinterpret_cast<uintptr_t>(codes) % 8 == 0) {
      CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), QuantizeRowsVec8Kernel, x, k,
                                              static_cast<int>(scheme), static_scale, codes,
                                              scales));
      return absl::OkStatus();
    }
    if (scheme == Fp8ActivationScheme::kDynamicGroup128 && k % 8 == 0 && Aligned16(x) &&
        reinterpret_cast<uintptr_t>(codes) % 8 == 0 && VecGroupsOn()) {
      const int64_t warps = m * ((k + kGroup * kGroupsPerWarp - 1) / (kGroup * kGroupsPerWarp));
      const internal::PdlLaunchConfig groups_config(
          dim3(static_cast<unsigned>((warps + kQuantThreads / 32 - 1) / (kQuantThreads / 32))),
          dim3(kQuantThreads), stream, programmatic_launch);
      CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(groups_config.get(), QuantizeGroupsVec8Kernel, x, m,
                                              k, codes, scales, group_major_ld));
      return absl::OkStatus();
    }
  }
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), QuantizeKernel<TIn>, x, k,
                                          static_cast<int>(scheme), static_scale, codes, scales,
                                          group_major_ld));
  return absl::OkStatus();
}

absl::Status QuantizeActivations(const __nv_bfloat16* x, int64_t m, int64_t k,
                                 Fp8ActivationScheme scheme, float static_scale, uint8_t* codes,
                                 float* scales, cudaStream_t stream, bool programmatic_launch,
                                 int64_t group_major_ld) {
  return QuantizeActivationsT(x, m, k, scheme, static_scale, codes, scales, stream,
                              programmatic_launch, group_major_ld);
}

absl::Status QuantizeActivations(const float* x, int64_t m, int64_t k, Fp8ActivationScheme scheme,
                                 float static_scale, uint8_t* codes, float* scales,
                                 cudaStream_t stream) {
  return QuantizeActivationsT(x, m, k, scheme, static_scale, codes, scales, stream, false, 0);
}

absl::Status QuantizeWeightTiles128(const float* w, int64_t n, int64_t k, uint8_t* codes,
                                    float* row_scales, float* block_scales, int64_t block_ld,
                                    cudaStream_t stream) {
  const int64_t groups = (k + kGroup - 1) / kGroup;
  if (w == nullptr || codes == nullptr || row_scales == nullptr || n < 1 || k < 1 ||
      (block_scales != nullptr && block_ld < groups) || (n + kGroup - 1) / kGroup > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeWeightTiles128: needs 1 <= n <= 65535 * 128, k >= 1, non-null codes and row "
        "scales and a block layout of at least ceil(k / 128) columns; got n=",
        n, " k=", k, " block_ld=", block_ld));
  }
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>((n + kGroup - 1) / kGroup));
  QuantizeTilesKernel<<<grid, kQuantThreads, 0, stream>>>(w, n, k, codes, row_scales, block_scales,
                                                          block_ld);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status DequantizeWeight(const uint8_t* codes, const float* scales, const Fp8ScaleGrid& grid,
                              __nv_bfloat16* out, cudaStream_t stream) {
  if (codes == nullptr || scales == nullptr || out == nullptr || grid.rows < 1 || grid.cols < 1 ||
      grid.block_rows != 1 || grid.block_cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DequantizeWeight: needs non-null buffers and per-row scales; got [", grid.rows, ", ",
        grid.cols, "] blocks ", grid.block_rows, "x", grid.block_cols));
  }
  const int64_t blocks = std::min<int64_t>((grid.rows * grid.cols + 255) / 256, 132 * 16);
  DequantizeKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      codes, scales, grid.rows, grid.cols, grid.GridCols(), grid.block_cols, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status AddBias(__nv_bfloat16* out, const __nv_bfloat16* bias, int64_t m, int64_t n,
                     cudaStream_t stream) {
  if (out == nullptr || bias == nullptr || m < 0 || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddBias: needs non-null buffers and n >= 1; got m=", m, " n=", n));
  }
  if (m == 0) return absl::OkStatus();
  const int64_t blocks = std::min<int64_t>((m * n + 255) / 256, 4096);
  AddBiasKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, bias, m, n);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename TOut>
absl::Status Fp8Gemv(const Fp8DeviceActivations& a, const Fp8DeviceWeight& w,
                     const __nv_bfloat16* bias, int64_t m, TOut* out, cudaStream_t stream) {
  const Fp8ScaleGrid& g = w.grid;
  const int64_t k = g.cols;
  const bool fp8_act = a.scheme != Fp8ActivationScheme::kNone;
  const bool ok = m >= 1 && m <= kFp8GemvMaxM && g.rows >= 1 && k >= 16 && k % 16 == 0 &&
                  g.block_rows == 1 && (g.block_cols == 128 || g.block_cols == k) &&
                  w.codes != nullptr && w.scales != nullptr && Aligned16(w.codes) &&
                  out != nullptr &&
                  (fp8_act ? a.codes != nullptr && a.scales != nullptr && Aligned16(a.codes)
                           : a.values != nullptr && Aligned16(a.values));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8Gemv: needs 1 <= m <= 16, k a positive multiple of 16, per-row scale blocks "
        "of 128 columns or the whole row, 16-byte aligned codes and non-null buffers; got m=",
        m, " n=", g.rows, " k=", k, " blocks ", g.block_rows, "x", g.block_cols));
  }
  GemvParams p{};
  p.a_codes = a.codes;
  p.a_values = a.values;
  p.a_scales = a.scales;
  p.a_scale_row_stride = a.scheme == Fp8ActivationScheme::kStaticTensor ? 0
                         : a.scheme == Fp8ActivationScheme::kDynamicToken
                             ? 1
                             : (k + kGroup - 1) / kGroup;
  p.a_group = a.scheme == Fp8ActivationScheme::kDynamicGroup128 ? kGroup : k;
  p.w_codes = w.codes;
  p.w_scales = w.scales;
  p.w_groups = g.GridCols();
  p.w_block_cols = g.block_cols;
  p.bias = bias;
  p.m = m;
  p.n = g.rows;
  p.k = k;
  CUDA_RETURN_IF_ERROR(
      (fp8_act ? Dispatch<true, TOut>(p, out, stream) : Dispatch<false, TOut>(p, out, stream)));
  return absl::OkStatus();
}

template absl::Status Fp8Gemv<__nv_bfloat16>(const Fp8DeviceActivations&, const Fp8DeviceWeight&,
                                             const __nv_bfloat16*, int64_t, __nv_bfloat16*,
                                             cudaStream_t);
template absl::Status Fp8Gemv<float>(const Fp8DeviceActivations&, const Fp8DeviceWeight&,
                                     const __nv_bfloat16*, int64_t, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
