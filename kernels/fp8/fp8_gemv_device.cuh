// Device pieces shared by the two decode FP8 GEMV kernels (fp8_gemv_cuda.h): the register-load
// kernel (fp8_gemv_cuda.cu; it also quantizes bf16 activations inside) and the streaming kernel
// (fp8_gemv_stream_cuda.cu; the default for codes and weight-only FP8). Internal: include from
// this package's .cu files only.
//
// Fragment layout (both kernels): lane (g = lane / 4, t = lane % 4) of a warp holds, for a
// 128-column group starting at column c, the 16 weight bytes at columns c + 16 t + 64 ch .. + 15
// (ch = 0, 1) of rows g and g + 8 of each 16-row tile, and the activations of tokens g (and 8 + g)
// at the same columns. A dot product does not care in which order k is summed, so k is permuted
// inside each 64-column chunk such that those 16 contiguous bytes form the lane's MMA fragments
// directly: no shuffles.
#ifndef TANDEM_KERNELS_FP8_FP8_GEMV_DEVICE_CUH_
#define TANDEM_KERNELS_FP8_FP8_GEMV_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mma_e4m3.cuh"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cuda::fp8_gemv_internal {

constexpr int kGroup = 128;  // columns a warp takes per step; the 128-column scale group
constexpr int kMaxTokens = 16;

// How the activations arrive (fp8_gemv_cuda.h).
enum class ActForm { kCodes, kFusedQuant, kBf16 };

struct Params {
  const uint8_t* w;               // [n, k] e4m3
  const float* w_scales;          // [n, w_groups]
  int64_t w_groups;               // 1 (whole row) or ceil(k / 128)
  const uint8_t* a_codes;         // kCodes: [m, k] e4m3
  const float* a_scales;          // kCodes: QuantizeActivations' scales
  int64_t a_scale_stride;         // kCodes: scales per token (0 static, 1 per token, groups)
  const __nv_bfloat16* a_values;  // kFusedQuant / kBf16: [m, k]
  int scheme;                     // Fp8ActivationScheme
  float static_scale;             // kFusedQuant with kStaticTensor
  bool group_scales;              // some scale changes every 128 columns
  const __nv_bfloat16* bias;      // [n] or null
  bool early_weight_loads;        // the first weight loads before the PDL wait
  int early_groups;               // kPipelined*: groups a warp loads before the PDL wait (0-4)
  bool early_l2_prefetch;         // kPipelinedPrefetchL2: the first groups to L2 before it
  int m;
  int64_t n, k;
};

using internal::MmaE4m3;  // kernels/cuda/mma_e4m3.cuh

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two e4m3 codes (low byte first) as a bf16x2 (exact: every e4m3 value is a half and a bf16).
__device__ __forceinline__ uint32_t E4m3x2ToBf16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// gacc += one group's products on the tensor cores, e4m3 x e4m3. wv[ch][rt][h]: the lane's 16
// weight bytes of row 16 rt + 8 h + g in 64-column chunk ch; b[ch][mt]: token 8 mt + g's 16
// codes there. A chunk feeds two k32 steps: step s takes words 2s (the fragment's columns
// 4t..4t+3) and 2s + 1 (columns 16 + 4t..), of the weight and the activations alike.
template <int RT, int MT>
__device__ __forceinline__ void GroupE4m3(const uint4 (&wv)[2][RT][2],
                                          const uint32_t (&b)[2][MT][4], float (&gacc)[RT][MT][4]) {
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const uint32_t a[4] = {Word(wv[ch][rt][0], 2 * s), Word(wv[ch][rt][1], 2 * s),
                               Word(wv[ch][rt][0], 2 * s + 1), Word(wv[ch][rt][1], 2 * s + 1)};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          MmaE4m3(gacc[rt][mt], a, b[ch][mt][2 * s], b[ch][mt][2 * s + 1]);
        }
      }
    }
  }
}

// Weight-only FP8: gacc += one group's products, the weight converted to bf16 (m16n8k16).
// av[ch][mt][0..1]: token 8 mt + g's 16 bf16 values at the lane's columns of chunk ch. Step s of
// a chunk takes weight word s (4 columns: the pair 2t, 2t + 1 and the pair 2t + 8, 2t + 9 of the
// fragment) and the activations' bf16 words 2s and 2s + 1 (the same 4 columns).
template <int RT, int MT>
__device__ __forceinline__ void GroupBf16(const uint4 (&wv)[2][RT][2], const uint4 (&av)[2][MT][2],
                                          float (&gacc)[RT][MT][4]) {
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const uint32_t w0 = Word(wv[ch][rt][0], s), w1 = Word(wv[ch][rt][1], s);
        const uint32_t a[4] = {E4m3x2ToBf16x2(w0), E4m3x2ToBf16x2(w1), E4m3x2ToBf16x2(w0 >> 16),
                               E4m3x2ToBf16x2(w1 >> 16)};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          internal::Mma16816<__nv_bfloat16>(gacc[rt][mt], a, Word(av[ch][mt][s / 2], 2 * (s % 2)),
                                            Word(av[ch][mt][s / 2], 2 * (s % 2) + 1));
        }
      }
    }
  }
}

// Output element idx of a tile's C fragments (idx = fragment register i * 32 + lane) with its
// summed value v: per-row / per-token scales (when constant along k), the bias, one rounding.
template <ActForm kForm, int MT, typename TOut>
__device__ __forceinline__ void Finish(const Params& p, int64_t tile, int idx, float v, TOut* out) {
  const int l = idx & 31, i = idx >> 5;
  const int mt = i / 4, c = i & 3;
  const int64_t row = tile * 16 + (l >> 2) + 8 * (c >> 1);
  const int tok = mt * 8 + 2 * (l & 3) + (c & 1);
  if (row >= p.n || tok >= p.m) return;
  if (!p.group_scales) {
    v *= p.w_scales[row];
    if constexpr (kForm == ActForm::kCodes) v *= p.a_scales[tok * p.a_scale_stride];
  }
  if (p.bias != nullptr) v += __bfloat162float(p.bias[row]);
  out[tok * p.n + row] = internal::FromFloat<TOut>(v);
}

// The streaming kernel's launch (fp8_gemv_stream_cuda.cu) for kCodes and kBf16.
template <ActForm kForm, typename TOut>
cudaError_t LaunchStream(const Params& p, TOut* out, cudaStream_t stream, bool pdl);

// The register-pipelined kernel (fp8_gemv_pipeline_cuda.cu): codes, m <= 8, scales constant
// along k (PipelineApplies), k < 2^30.
bool PipelineApplies(const Params& p);
template <typename TOut>
cudaError_t LaunchPipeline(const Params& p, TOut* out, cudaStream_t stream, bool pdl);

}  // namespace tandem::kernels::cuda::fp8_gemv_internal

#endif  // TANDEM_KERNELS_FP8_FP8_GEMV_DEVICE_CUH_
