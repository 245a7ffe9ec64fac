// The FP8 decode expert GEMVs (moe_fp8_cuda.h): moe_expert_cuda.cu's layout (a block per
// (feature tile, active expert), a warp streaming two weight rows at once) on e4m3 weights.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::Vec;
using internal::VecToFloat;

constexpr int kWarps = 8;
constexpr int kUnroll = 4;       // 16-byte weight loads in flight per lane and row
constexpr int kRowsPerWarp = 2;  // gate and up of one output, or two down features
constexpr int kGroup = 128;

struct GemvArgs {
  const __nv_bfloat16* a_values;  // kNone
  const uint8_t* a_codes;         // other schemes
  const float* a_scales;
  int64_t a_scale_stride;  // scales per activation row: 0 static, 1 per token, groups for 1x128
  bool a_grouped;          // 1x128 activation groups
  MoeFp8Experts w;
  int64_t n_out, k;
  DeviceMoePermutation perm;
  __nv_bfloat16* out;
};

// The 16 activations of row `row` at column `col`, as floats (codes' values or bf16 values).
template <bool kFp8Act>
__device__ __forceinline__ void LoadActivations(const GemvArgs& p, int64_t row, int64_t col,
                                                float (&af)[16]) {
  if constexpr (kFp8Act) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.a_codes + row * p.k + col));
    VecToFloat(*reinterpret_cast<const Vec<__nv_fp8_e4m3, 16>*>(&v), af);
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(p.a_values + row * p.k + col);
    const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v0), af);
    VecToFloat(*reinterpret_cast<const Vec<__nv_bfloat16, 8>*>(&v1), af + 8);
  }
}

// kGateUp: warp = output column `feature` of act (gate row feature and up row n_out + feature of
// the expert; input rows gathered through token_of_row); else warp = output features feature,
// feature + 1 of down (input rows the expert's contiguous act rows). M rows per weight read.
template <int M, bool kGateUp, bool kFp8Act>
__global__ void __launch_bounds__(kWarps * 32)
    Fp8ExpertGemvKernel(const __grid_constant__ GemvArgs p) {
  internal::WaitForPrecedingGrid();  // PDL: the permutation and the activations
  internal::AllowDependentLaunch();
  constexpr int kFeat = kGateUp ? 1 : kRowsPerWarp;
  const int expert = p.perm.active_experts[blockIdx.y];
  const int64_t feature = (int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5)) * kFeat;
  if (expert < 0 || feature >= p.n_out) return;
  const int lane = threadIdx.x & 31;
  const int begin = p.perm.expert_offsets[expert], end = p.perm.expert_offsets[expert + 1];
  const uint8_t* codes = p.w.codes[expert];
  const float* scales = p.w.scales[expert];
  const uint4* wrow[kRowsPerWarp];
  const float* wscale[kRowsPerWarp];
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) {
    const int64_t row = kGateUp ? q * p.n_out + feature : min(feature + q, p.n_out - 1);
    wrow[q] = reinterpret_cast<const uint4*>(codes + row * p.k);
    wscale[q] = scales + row * p.w.groups;
  }
  const int64_t chunks = p.k / 16;
  for (int r0 = begin; r0 < end; r0 += M) {
    int64_t arow[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int r = min(r0 + m, end - 1);  // past the expert's rows: a repeat, not stored
      arow[m] = kGateUp ? p.perm.token_of_row[r] : r;
    }
    float acc[kRowsPerWarp][M];
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
#pragma unroll
      for (int m = 0; m < M; ++m) acc[q][m] = 0.0f;
    }
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
      uint4 held[kRowsPerWarp][kUnroll];
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = c0 + 32 * u;
          held[q][u] = c < chunks ? __ldcs(wrow[q] + c) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
        const int64_t col = c * 16, group = col / kGroup;
        float wf[kRowsPerWarp][16], ws[kRowsPerWarp];
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) {
          VecToFloat(*reinterpret_cast<const Vec<__nv_fp8_e4m3, 16>*>(&held[q][u]), wf[q]);
          ws[q] = wscale[q][p.w.groups == 1 ? 0 : group];
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float af[16];
          LoadActivations<kFp8Act>(p, arow[m], col, af);
          float as = 1.0f;
          if constexpr (kFp8Act) {
            as = p.a_scales[arow[m] * p.a_scale_stride + (p.a_grouped ? group : 0)];
          }
#pragma unroll
          for (int q = 0; q < kRowsPerWarp; ++q) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < 16; ++e) dot = fmaf(wf[q][e], af[e], dot);
            acc[q][m] = fmaf(dot, ws[q] * as, acc[q][m]);
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          acc[q][m] += __shfl_xor_sync(0xffffffffu, acc[q][m], off);
        }
      }
    }
    if (lane != 0) continue;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (r0 + m >= end) break;
      __nv_bfloat16* dst = p.out + static_cast<int64_t>(r0 + m) * p.n_out + feature;
      if constexpr (kGateUp) {
        // Gate and up rounded to bf16 first, then SiluAndMul's expression (as the bf16 GEMV).
        const float g = __bfloat162float(__float2bfloat16_rn(acc[0][m]));
        const float u = __bfloat162float(__float2bfloat16_rn(acc[1][m]));
        *dst = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
      } else {
#pragma unroll
        for (int q = 0; q < kFeat; ++q) {
          if (feature + q < p.n_out) dst[q] = __float2bfloat16_rn(acc[q][m]);
        }
      }
    }
  }
}

// Checks the arguments and picks the template constants (rows per weight read, activation form).
template <bool kGateUp>
absl::Status Launch(const MoeFp8Activations& a, const MoeFp8Experts& w, int64_t n_out, int64_t k,
                    const DeviceMoePermutation& perm, int64_t num_experts, int64_t rows,
                    __nv_bfloat16* out, cudaStream_t stream, bool programmatic_launch) {
  const char* what = kGateUp ? "MoeFp8ExpertGemvGateUp" : "MoeFp8ExpertGemvDown";
  const bool fp8_act = a.scheme != Fp8ActivationScheme::kNone;
  const void* act = fp8_act ? static_cast<const void*>(a.codes) : a.values;
  const int64_t groups = (k + kGroup - 1) / kGroup;
  if (n_out < 1 || k < 16 || k % 16 != 0 || num_experts < 1 || num_experts > kMoeMaxExperts ||
      rows < 0 || (w.groups != 1 && w.groups != groups) || w.codes == nullptr ||
      w.scales == nullptr || act == nullptr || reinterpret_cast<uintptr_t>(act) % 16 != 0 ||
      (fp8_act && a.scales == nullptr) || out == nullptr ||
      n_out > int64_t{kWarps} * kRowsPerWarp * 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": outputs ", n_out, ", inputs ", k, " (a positive multiple of 16), weight groups ",
        w.groups, " (1 or ", groups, "), experts ", num_experts, " (1..", kMoeMaxExperts,
        "), rows ", rows, ", activations and scales as the scheme needs, 16-byte aligned"));
  }
  if (rows == 0) return absl::OkStatus();
  GemvArgs p{};
  p.a_values = a.values;
  p.a_codes = a.codes;
  p.a_scales = a.scales;
  p.a_scale_stride = a.scheme == Fp8ActivationScheme::kStaticTensor      ? 0
                     : a.scheme == Fp8ActivationScheme::kDynamicGroup128 ? groups
                                                                         : 1;
  p.a_grouped = a.scheme == Fp8ActivationScheme::kDynamicGroup128;
  p.w = w;
  p.n_out = n_out;
  p.k = k;
  p.perm = perm;
  p.out = out;
  const int64_t per_block = int64_t{kWarps} * (kGateUp ? 1 : kRowsPerWarp);
  const dim3 grid(static_cast<unsigned>((n_out + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min(num_experts, rows)));
  const int64_t mean = (rows + num_experts - 1) / num_experts;  // rows per expert, rounded up
  const internal::PdlLaunchConfig config(grid, dim3(kWarps * 32), stream, programmatic_launch);
  cudaError_t launched = cudaSuccess;
  auto launch = [&](auto kernel) { launched = cudaLaunchKernelEx(config.get(), kernel, p); };
  auto by_rows = [&](auto one, auto two, auto four, auto eight) {
    if (mean <= 1) {
      launch(one);
    } else if (mean <= 2) {
      launch(two);
    } else if (mean <= 4) {
      launch(four);
    } else {
      launch(eight);
    }
  };
  if (fp8_act) {
    by_rows(Fp8ExpertGemvKernel<1, kGateUp, true>, Fp8ExpertGemvKernel<2, kGateUp, true>,
            Fp8ExpertGemvKernel<4, kGateUp, true>, Fp8ExpertGemvKernel<8, kGateUp, true>);
  } else {
    by_rows(Fp8ExpertGemvKernel<1, kGateUp, false>, Fp8ExpertGemvKernel<2, kGateUp, false>,
            Fp8ExpertGemvKernel<4, kGateUp, false>, Fp8ExpertGemvKernel<8, kGateUp, false>);
  }
  CUDA_RETURN_IF_ERROR(launched);
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeFp8ExpertGemvGateUp(const MoeFp8Activations& x, const MoeFp8Experts& gate_up,
                                    int64_t hidden, int64_t inter, const DeviceMoePermutation& perm,
                                    int64_t num_experts, int64_t rows, __nv_bfloat16* act,
                                    cudaStream_t stream, bool programmatic_launch) {
  return Launch<true>(x, gate_up, inter, hidden, perm, num_experts, rows, act, stream,
                      programmatic_launch);
}

absl::Status MoeFp8ExpertGemvDown(const MoeFp8Activations& act, const MoeFp8Experts& down,
                                  int64_t hidden, int64_t inter, const DeviceMoePermutation& perm,
                                  int64_t num_experts, int64_t rows, __nv_bfloat16* out,
                                  cudaStream_t stream, bool programmatic_launch) {
  return Launch<false>(act, down, hidden, inter, perm, num_experts, rows, out, stream,
                       programmatic_launch);
}

}  // namespace tandem::kernels::cuda
