#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/fp8/fp8_gemv_device.cuh"

namespace tandem::kernels::cuda {
namespace {

using fp8_gemv_internal::ActForm;
using fp8_gemv_internal::GroupBf16;
using fp8_gemv_internal::GroupE4m3;
using fp8_gemv_internal::kGroup;
using fp8_gemv_internal::kMaxTokens;
using fp8_gemv_internal::Params;
using fp8_gemv_internal::Word;

// m > 8 (two 8-token MMA tiles): 32 rows per block once there are enough of them to fill an
// H200's 132 SMs twice over (each block then re-reads the activations from L2 half as often),
// else 16.
constexpr int64_t kTwoTilesMinRows = 8192;
constexpr int64_t kEightWarpsMaxRows = 2 * 132 * 16;

constexpr int kToken = static_cast<int>(Fp8ActivationScheme::kDynamicToken);
constexpr int kGroup128 = static_cast<int>(Fp8ActivationScheme::kDynamicGroup128);
constexpr int kStatic = static_cast<int>(Fp8ActivationScheme::kStaticTensor);

// Eight bf16 as floats.
__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = Word(v, i);
    f[2 * i] = __uint_as_float(u << 16);
    f[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
  }
}

// x / s rounded as an IEEE division (what QuantizeActivations computes), from inv = 1 / s
// (correctly rounded, once per scale): q = x * inv is within an ulp, and one FMA residual step
// rounds it correctly (Markstein). Outside the range where that holds: zeros keep q (their
// sign; a real division of 0 takes the compiler's slow path, which made the fused kernel 5x
// slower on the zero rows of m < 8 tiles, H200), |q| >= 440 saturates to 448 either way, and
// tiny |x| or a denormal s take the division. Checked against the division on 1.9e8 random
// bf16 x (zeros included) and scales (static and amax / 448): the same e4m3 codes.
__device__ __forceinline__ float Quotient(float x, float s, float inv) {
  const float q = __fmul_rn(x, inv);
  if (fabsf(x) >= 0x1p-100f && fabsf(q) < 440.0f) return __fmaf_rn(__fmaf_rn(-q, s, x), inv, q);
  if (isfinite(inv) && (x == 0.0f || fabsf(q) >= 440.0f)) return q;
  return x / s;
}

// Two quantized values (Quotient, then e4m3 with saturation) packed low first.
__device__ __forceinline__ uint32_t QuantizePair(float x0, float x1, float s, float inv) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(
      make_float2(Quotient(x0, s, inv), Quotient(x1, s, inv)), __NV_SATFINITE, __NV_E4M3));
}

// Fused per-token quantization's prologue: scale[r] = max |a[r, :]| / 448 (1 for a zero row)
// for r < m, from one pass of the whole block over the m rows.
template <int MT, int kWarps>
__device__ void TokenScales(const Params& p, float* scale) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float warp_amax[kWarps][kMaxTokens];
  constexpr int kRows = MT * 8;
  float amax[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) amax[r] = 0.0f;
  for (int64_t v = threadIdx.x; v < p.k / 8; v += kThreads) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= p.m) break;
      float f[8];
      Bf16x8ToFloat(__ldg(reinterpret_cast<const uint4*>(p.a_values + r * p.k) + v), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) amax[r] = fmaxf(amax[r], fabsf(f[e]));
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax[r] = fmaxf(amax[r], __shfl_xor_sync(0xffffffffu, amax[r], off));
    }
    if (lane == 0) warp_amax[warp][r] = amax[r];
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) a = fmaxf(a, warp_amax[w][threadIdx.x]);
    scale[threadIdx.x] = a > 0.0f ? a / kFp8E4m3Max : 1.0f;
  }
  __syncthreads();
}

// The B fragments (e4m3) of this lane for one 128-column group: b[ch][mt] holds token
// 8 mt + g's 16 codes at columns c0 + 64 ch .. + 15 (c0 = group start + 16 t), and a_scale[mt][j]
// the group's scale of token 8 mt + 2 t + j (used only when scales change per group).
template <ActForm kForm, int MT>
__device__ __forceinline__ void ActivationFragments(const Params& p, int64_t gi, int64_t c0, int g,
                                                    int t, const float* token_scale,
                                                    uint32_t (&b)[2][MT][4],
                                                    float (&a_scale)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tok = mt * 8 + g;
    const bool ok = tok < p.m;
    if constexpr (kForm == ActForm::kCodes) {
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
        const int64_t c = c0 + ch * 64;
        const uint4 v = ok && c < p.k
                            ? __ldg(reinterpret_cast<const uint4*>(p.a_codes + tok * p.k + c))
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < 4; ++i) b[ch][mt][i] = Word(v, i);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tj = mt * 8 + 2 * t + j;
        const int64_t idx = tj * p.a_scale_stride + (p.a_scale_stride > 1 ? gi : 0);
        a_scale[mt][j] = p.group_scales && tj < p.m ? p.a_scales[idx] : 0.0f;
      }
    } else {
      float x[2][16];
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
        const int64_t c = c0 + ch * 64;
        const uint4* src = reinterpret_cast<const uint4*>(p.a_values + tok * p.k + c);
        const bool in = ok && c < p.k;
        Bf16x8ToFloat(in ? __ldg(src) : make_uint4(0, 0, 0, 0), x[ch]);
        Bf16x8ToFloat(in ? __ldg(src + 1) : make_uint4(0, 0, 0, 0), x[ch] + 8);
      }
      float scale;
      if (p.scheme == kGroup128) {
        // The group's 128 columns of this token are in the 4 lanes of the same g.
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(x[e / 16][e % 16]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
      } else {
        scale = p.scheme == kStatic ? p.static_scale : ok ? token_scale[tok] : 1.0f;
      }
      const float inv = 1.0f / scale;
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          b[ch][mt][i] = QuantizePair(x[ch][4 * i], x[ch][4 * i + 1], scale, inv) |
                         QuantizePair(x[ch][4 * i + 2], x[ch][4 * i + 3], scale, inv) << 16;
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        a_scale[mt][j] = __shfl_sync(0xffffffffu, scale, (2 * t + j) * 4);
      }
    }
  }
}

// The activation scale of token `tok` applied after the k loop (scales constant along k).
template <ActForm kForm>
__device__ __forceinline__ float FinalTokenScale(const Params& p, int tok,
                                                 const float* token_scale) {
  if constexpr (kForm == ActForm::kBf16) {
    return 1.0f;
  } else if constexpr (kForm == ActForm::kCodes) {
    return p.a_scales[tok * p.a_scale_stride];
  } else {
    return p.scheme == kStatic ? p.static_scale : token_scale[tok];
  }
}

// One 128-column group of one warp: its products summed on the tensor cores, then promoted to
// the fp32 accumulators, with the group's scales where they change per group.
template <ActForm kForm, int RT, int MT>
__device__ __forceinline__ void GroupStep(const Params& p, int64_t gi, int64_t c0, int g, int t,
                                          int64_t row0, const bool (&wok)[RT][2],
                                          const float* token_scale, const uint4 (&wv)[2][RT][2],
                                          float (&acc)[RT][MT][4]) {
  float gacc[RT][MT][4] = {};
  float a_scale[MT][2];
  if constexpr (kForm == ActForm::kBf16) {
    uint4 av[2][MT][2];
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t c = c0 + ch * 64;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int tok = mt * 8 + g;
        const bool in = tok < p.m && c < p.k;
        const uint4* src = reinterpret_cast<const uint4*>(p.a_values + tok * p.k + c);
        av[ch][mt][0] = in ? __ldg(src) : make_uint4(0, 0, 0, 0);
        av[ch][mt][1] = in ? __ldg(src + 1) : make_uint4(0, 0, 0, 0);
      }
    }
    GroupBf16<RT, MT>(wv, av, gacc);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) a_scale[mt][0] = a_scale[mt][1] = 1.0f;
  } else {
    uint32_t b[2][MT][4];
    ActivationFragments<kForm, MT>(p, gi, c0, g, t, token_scale, b, a_scale);
    GroupE4m3<RT, MT>(wv, b, gacc);
  }
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    float ws[2] = {1.0f, 1.0f};
    if (p.group_scales) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + rt * 16 + h * 8 + g;
        ws[h] = wok[rt][h] ? p.w_scales[r * p.w_groups + (p.w_groups > 1 ? gi : 0)] : 0.0f;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float s = p.group_scales ? ws[i >> 1] * a_scale[mt][i & 1] : 1.0f;
        acc[rt][mt][i] = fmaf(gacc[rt][mt][i], s, acc[rt][mt][i]);
      }
    }
  }
}

// The weight bytes of kInFlight 128-column groups from g0 (every kWarps-th group) of this lane:
// wv[q][ch][rt][h] = 16 bytes of row 16 rt + 8 h + g at column (g0 + q kWarps) 128 + 16 t +
// 64 ch (evict-first; zero past k or n).
template <int RT, int kWarps, int kInFlight>
__device__ __forceinline__ void LoadWeightGroups(const uint8_t* const (&wrow)[RT][2],
                                                 const bool (&wok)[RT][2], int64_t g0, int t,
                                                 int64_t k, uint4 (&wv)[kInFlight][2][RT][2]) {
#pragma unroll
  for (int q = 0; q < kInFlight; ++q) {
    const int64_t c0 = (g0 + q * kWarps) * kGroup + t * 16;
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t c = c0 + ch * 64;
          wv[q][ch][rt][h] = wok[rt][h] && c < k
                                 ? __ldcs(reinterpret_cast<const uint4*>(wrow[rt][h] + c))
                                 : make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
}

// One block: rows [16 RT blockIdx.x, + 16 RT) of the output columns for all m <= 8 MT tokens.
// Lane (g = lane / 4, t = lane % 4) loads weight rows g and g + 8 of each 16-row tile and the
// activations of tokens g (and 8 + g).
template <ActForm kForm, int RT, int MT, int kWarps, int kInFlight, typename TOut>
__global__ void __launch_bounds__(kWarps * 32)
    Fp8SmallMKernel(const __grid_constant__ Params p, TOut* __restrict__ out) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float token_scale[kMaxTokens];
  __shared__ float partial[kWarps][RT * MT * 4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t{blockIdx.x} * (16 * RT);
  const uint8_t* wrow[RT][2];
  bool wok[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + rt * 16 + h * 8 + g;
      wok[rt][h] = r < p.n;
      wrow[rt][h] = p.w + (wok[rt][h] ? r : 0) * p.k;
    }
  }
  float acc[RT][MT][4] = {};
  const int64_t groups = (p.k + kGroup - 1) / kGroup;
  // kInFlight groups per iteration, all their weight loads issued before any is used: 256 bytes
  // in flight per lane. The weights are never written by a preceding kernel, so the first
  // iteration's loads are issued BEFORE waiting for the preceding grid (PDL): they overlap its
  // tail (the norm or activation quantization before every projection of a decode step).
  uint4 wv[kInFlight][2][RT][2];
  if (p.early_weight_loads) LoadWeightGroups<RT, kWarps, kInFlight>(wrow, wok, warp, t, p.k, wv);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early_weight_loads) LoadWeightGroups<RT, kWarps, kInFlight>(wrow, wok, warp, t, p.k, wv);
  if constexpr (kForm == ActForm::kFusedQuant) {
    if (p.scheme == kToken) TokenScales<MT, kWarps>(p, token_scale);
  }
  for (int64_t g0 = warp; g0 < groups; g0 += kInFlight * kWarps) {
    if (g0 != warp) LoadWeightGroups<RT, kWarps, kInFlight>(wrow, wok, g0, t, p.k, wv);
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int64_t gi = g0 + q * kWarps;
      if (gi >= groups) break;
      GroupStep<kForm, RT, MT>(p, gi, gi * kGroup + t * 16, g, t, row0, wok, token_scale, wv[q],
                               acc);
    }
  }
  // The warps' partial sums (each warp took every 8th group) meet in shared memory.
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][(rt * MT + mt) * 4 + i][lane] = acc[rt][mt][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < RT * MT * 4 * 32; idx += kThreads) {
    const int l = idx & 31, i = idx >> 5;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[w][i][l];
    const int rt = i / (MT * 4), mt = (i / 4) % MT, c = i & 3;
    const int64_t row = row0 + rt * 16 + (l >> 2) + 8 * (c >> 1);
    const int tok = mt * 8 + 2 * (l & 3) + (c & 1);
    if (row >= p.n || tok >= p.m) continue;
    if (!p.group_scales) v *= p.w_scales[row] * FinalTokenScale<kForm>(p, tok, token_scale);
    if (p.bias != nullptr) v += __bfloat162float(p.bias[row]);
    out[tok * p.n + row] = internal::FromFloat<TOut>(v);
  }
}

template <ActForm kForm, int RT, int MT, int kWarps, int kInFlight, typename TOut>
cudaError_t Launch(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  const internal::PdlLaunchConfig config(
      dim3(static_cast<unsigned>((p.n + 16 * RT - 1) / (16 * RT))), dim3(kWarps * 32), stream, pdl);
  return cudaLaunchKernelEx(config.get(), Fp8SmallMKernel<kForm, RT, MT, kWarps, kInFlight, TOut>,
                            p, out);
}

// The one place where runtime values become template constants.
template <ActForm kForm, typename TOut>
cudaError_t DispatchTiles(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  // m <= 8: 16 rows a block, 4 groups (16 weight loads of 16 bytes) in flight per lane, ~128
  // registers; 8 warps a block (2 blocks an SM) while n / 16 blocks fit on an H200's 132 SMs
  // twice, else 4 (4 blocks an SM: n = 6144 in one wave). H200, m = 1: 8 warps with 2 groups in
  // flight read 2.2-3.3 TB/s; 4 warps with 4 groups everywhere lost on n = 4096 (2.0-2.6).
  if (p.m <= 8) {
    return p.n <= kEightWarpsMaxRows ? Launch<kForm, 1, 1, 8, 4, TOut>(p, out, stream, pdl)
                                     : Launch<kForm, 1, 1, 4, 4, TOut>(p, out, stream, pdl);
  }
  return p.n >= kTwoTilesMinRows ? Launch<kForm, 2, 2, 8, 2, TOut>(p, out, stream, pdl)
                                 : Launch<kForm, 1, 2, 8, 2, TOut>(p, out, stream, pdl);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool Fp8SmallMLinearSupported(const Fp8SmallMActivations& a, const Fp8DeviceWeight& w, int64_t m) {
  const Fp8ScaleGrid& g = w.grid;
  const int64_t k = g.cols;
  const bool weight_ok = g.rows >= 1 && k >= 16 && k % 16 == 0 && g.block_rows == 1 &&
                         (g.block_cols == kGroup || g.block_cols >= k) && w.codes != nullptr &&
                         w.scales != nullptr && Aligned16(w.codes) && g.rows <= (int64_t{1} << 31);
  bool act_ok;
  if (a.scheme == Fp8ActivationScheme::kNone || a.codes == nullptr) {
    act_ok = a.values != nullptr && Aligned16(a.values) &&
             (a.scheme != Fp8ActivationScheme::kStaticTensor || a.static_scale > 0.0f);
  } else {
    act_ok = Aligned16(a.codes) && a.scales != nullptr;
  }
  return m >= 1 && m <= kFp8SmallMMaxM && weight_ok && act_ok;
}

// H200 (nvidia-h200-x4, BENCHMARKS.md): with m <= 8 and per-row scales the streaming kernel made
// the Llama-3-8B batch-1 decode step 3.307 ms against 3.505 (same call) and won most Llama-3-70B
// projections; at m > 8 (two 8-token tiles on 2 warps) and with per-group scales (4-byte copies
// of the scales beside each group) it lost on most shapes. The pipelined kernel (nvidia-h200,
// same call): the Llama-3-8B batch-8 decode step 3.83 ms against 4.12-4.15 with the streaming
// one, but at batch 1 3.33-3.35 against 3.31-3.32 (though it was faster alone, in a PDL chain,
// on 20 of 24 projections at m = 1): it takes 2 <= m <= 8 (e4m3 codes; weight-only FP8 keeps
// the streaming kernel there, Fp8SmallMLinear). At m = 1 (nvidia-h200, one call, BENCHMARKS.md):
// Llama-3-70B's step (every projection n, k >= 8192) 23.628 ms streaming, 22.974 pipelined,
// 22.839 with one group loaded before the PDL wait (kPipelinedOneEarly); Llama-3-8B's (n or k
// 4096) stays fastest streaming (3.318-3.322 against 3.331-3.352 for either pipelined form).
Fp8GemvKernel Fp8GemvAutoKernel(int64_t m, int64_t n, int64_t k, bool group_scales) {
  constexpr int64_t kPipelinedMinSide = 8192;
  if (m > 8 || group_scales) return Fp8GemvKernel::kRegisterLoads;
  if (m > 1) return Fp8GemvKernel::kPipelined;
  return std::min(n, k) >= kPipelinedMinSide ? Fp8GemvKernel::kPipelinedOneEarly
                                             : Fp8GemvKernel::kStreaming;
}

template <typename TOut>
absl::Status Fp8SmallMLinear(const Fp8SmallMActivations& a, const Fp8DeviceWeight& w,
                             const __nv_bfloat16* bias, int64_t m, TOut* out, cudaStream_t stream,
                             bool programmatic_launch, bool early_weight_loads,
                             Fp8GemvKernel kernel) {
  if (!Fp8SmallMLinearSupported(a, w, m) || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8SmallMLinear: needs 1 <= m <= ", kFp8SmallMMaxM,
        ", k a positive multiple of 16, per-row scale blocks of 128 columns or the whole row, "
        "16-byte aligned codes / activations, a positive static scale to quantize with and "
        "non-null buffers; got m=",
        m, " n=", w.grid.rows, " k=", w.grid.cols, " blocks ", w.grid.block_rows, "x",
        w.grid.block_cols, " scheme ", static_cast<int>(a.scheme)));
  }
  const int64_t k = w.grid.cols;
  Params p{};
  p.w = w.codes;
  p.w_scales = w.scales;
  p.w_groups = w.grid.GridCols();
  p.a_codes = a.codes;
  p.a_scales = a.scales;
  p.a_scale_stride = a.scheme == Fp8ActivationScheme::kStaticTensor   ? 0
                     : a.scheme == Fp8ActivationScheme::kDynamicToken ? 1
                                                                      : (k + kGroup - 1) / kGroup;
  p.a_values = a.values;
  p.scheme = static_cast<int>(a.scheme);
  p.static_scale = a.static_scale;
  p.group_scales = p.w_groups > 1 || a.scheme == Fp8ActivationScheme::kDynamicGroup128;
  p.bias = bias;
  p.early_weight_loads = early_weight_loads;
  p.m = static_cast<int>(m);
  p.n = w.grid.rows;
  p.k = k;
  const bool pdl = programmatic_launch;
  if (kernel == Fp8GemvKernel::kAuto) kernel = Fp8GemvAutoKernel(m, p.n, k, p.group_scales);
  p.early_groups = !early_weight_loads                           ? 0
                   : kernel == Fp8GemvKernel::kPipelined         ? 4
                   : kernel == Fp8GemvKernel::kPipelinedOneEarly ? 1
                                                                 : 0;
  p.early_l2_prefetch = early_weight_loads && kernel == Fp8GemvKernel::kPipelinedPrefetchL2;
  if (IsPipelinedGemv(kernel) && a.codes != nullptr && a.scheme != Fp8ActivationScheme::kNone &&
      fp8_gemv_internal::PipelineApplies(p)) {
    CUDA_RETURN_IF_ERROR(fp8_gemv_internal::LaunchPipeline<TOut>(p, out, stream, pdl));
    return absl::OkStatus();
  }
  // Where the pipelined kernel does not apply, the streaming kernel (weight-only FP8) or the
  // register-load kernel (everything else) runs instead.
  const bool stream_kernel =
      kernel == Fp8GemvKernel::kStreaming || (IsPipelinedGemv(kernel) && m <= 8 && !p.group_scales);
  if (a.scheme == Fp8ActivationScheme::kNone) {
    CUDA_RETURN_IF_ERROR(
        (stream_kernel ? fp8_gemv_internal::LaunchStream<ActForm::kBf16, TOut>(p, out, stream, pdl)
                       : DispatchTiles<ActForm::kBf16, TOut>(p, out, stream, pdl)));
  } else if (a.codes != nullptr) {
    CUDA_RETURN_IF_ERROR(
        (stream_kernel ? fp8_gemv_internal::LaunchStream<ActForm::kCodes, TOut>(p, out, stream, pdl)
                       : DispatchTiles<ActForm::kCodes, TOut>(p, out, stream, pdl)));
  } else {
    CUDA_RETURN_IF_ERROR((DispatchTiles<ActForm::kFusedQuant, TOut>(p, out, stream, pdl)));
  }
  return absl::OkStatus();
}

template absl::Status Fp8SmallMLinear<__nv_bfloat16>(const Fp8SmallMActivations&,
                                                     const Fp8DeviceWeight&, const __nv_bfloat16*,
                                                     int64_t, __nv_bfloat16*, cudaStream_t, bool,
                                                     bool, Fp8GemvKernel);
template absl::Status Fp8SmallMLinear<float>(const Fp8SmallMActivations&, const Fp8DeviceWeight&,
                                             const __nv_bfloat16*, int64_t, float*, cudaStream_t,
                                             bool, bool, Fp8GemvKernel);

}  // namespace tandem::kernels::cuda
