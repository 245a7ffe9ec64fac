// Device pieces shared by the batch-1 weight-only FP8 GEMV kernels (fp8_w8a16_gemv_cuda.h): the
// register-load kernels (fp8_w8a16_gemv_cuda.cu) and the shared-memory ring kernel
// (fp8_w8a16_ring_cuda.cu). Internal: include from this package's .cu files only.
#ifndef TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_
#define TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/gemm/cuda/gemv_norm_stage.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;  // 256 threads: StageRmsNorm's (RmsNormKernel's) block size
constexpr int kLoads = 8;  // 16-byte weight loads in flight per lane, over the warp's rows

// What a kernel does around the product (gemv_cuda.cu's folds): kNormIn multiplies the staged
// RmsNorm(a); kAddOut adds the rounded product into out (the residual stream).
enum class Fold { kNone, kNormIn, kAddOut };

struct Args {
  const bf16* a;            // [k]: the activations, or the residual stream under kNormIn
  const uint8_t* w;         // [R * n, k] e4m3
  const float* scales;      // [R * n], constant along k
  const bf16* bias;         // [R * n] or null
  int64_t n, k;             // output rows (inter for SiLU-and-mul), columns
  const bf16* norm_weight;  // kNormIn: [k]
  float eps;
  bool early;  // the first weight loads before the PDL wait
};

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Grouped weights (fp8_w8a16_gemv_cuda.h): p.scales is [R * n, ceil(k / 128)], one scale per
// row and 128-column group (a partial last group its own), applied to each group's partial dot.
constexpr int kScaleGroupChunks = 128 / 16;  // 16-column chunks in a scale group
__device__ __forceinline__ int64_t ScaleGroups(int64_t k) { return (k + 127) / 128; }

// The output of row `row` (R = 2: column `row` of SiLU(gate) * up) from its dot products times
// `unit` (the codes' f16 scale undone): the row's weight scale (kRowScale; grouped weights have
// theirs in dot already), the bias, the fold, one rounding.
template <typename TOut, int R, Fold kFold, bool kRowScale = true>
__device__ __forceinline__ void StoreRow(const Args& p, int64_t row, const float (&dot)[R],
                                         float unit, TOut* __restrict__ out) {
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t wr = row + r * p.n;
    if constexpr (kRowScale) {
      v[r] = dot[r] * unit * p.scales[wr];
    } else {
      v[r] = dot[r] * unit;
    }
    if (p.bias != nullptr) v[r] += __bfloat162float(p.bias[wr]);
  }
  if constexpr (R == 2) {
    // Gate and up rounded to bf16 as the unfused path stores them, then SiluAndMul's expression
    // verbatim (expf, not __expf): bit-identical to the two kernels.
    const float g = __bfloat162float(__float2bfloat16_rn(v[0]));
    const float u = __bfloat162float(__float2bfloat16_rn(v[1]));
    out[row] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
  } else if constexpr (kFold == Fold::kAddOut) {
    // The unfused path's two roundings: the product to bf16, then FusedAddRmsNorm's update.
    const float prev = __bfloat162float(out[row]);
    out[row] = __float2bfloat16_rn(prev + __bfloat162float(__float2bfloat16_rn(v[0])));
  } else {
    out[row] = internal::FromFloat<TOut>(v[0]);
  }
}

constexpr int kMmaRows = 16;              // output rows per block
constexpr int kGroupChunks = 4 * kWarps;  // chunks (16 columns) between a warp's groups

__device__ __forceinline__ void E4m3x4ToHalf2x2(uint32_t q, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(q));
}

__device__ __forceinline__ void MmaF16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[r] += the lane's part of the group's 4 mma (row set r) at its chunk c.
template <int R>
__device__ __forceinline__ void MmaGroup(const uint4 (&wv)[R][2], const uint4* act, int c,
                                         int chunks, float (&acc)[R][4]) {
  uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
  if (c < chunks) b0 = act[2 * c], b1 = act[2 * c + 1];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4& b = j < 2 ? b0 : b1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t a0, a1, a2, a3;
      E4m3x4ToHalf2x2(Word(wv[r][0], j), a0, a2);  // row g: k 2t, 2t + 1 | 2t + 8, 2t + 9
      E4m3x4ToHalf2x2(Word(wv[r][1], j), a1, a3);  // row g + 8
      MmaF16(acc[r], a0, a1, a2, a3, Word(b, (2 * j) & 3), Word(b, (2 * j + 1) & 3));
    }
  }
}

// act16 [k] (shared) = the bf16 activations as f16 (exact for 2^-14 <= |x| <= 65504), from
// global memory (src) or in place (src == null: the staged bf16 row already in act16). Barrier
// after.
__device__ __forceinline__ void StageF16(const bf16* src, int64_t k, uint4* act16) {
  for (int64_t i = threadIdx.x; i < k / 8; i += kWarps * 32) {
    const uint4 x = src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src) + i) : act16[i];
    uint32_t y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = Word(x, j);
      const __half2 h =
          __floats2half2_rn(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
      y[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    act16[i] = make_uint4(y[0], y[1], y[2], y[3]);
  }
  __syncthreads();
}

// The tensor-core forms' activations into act16 [k] (shared) as f16: the staged RmsNorm(a) under
// kNormIn (4 k bytes of act16: the bf16 row, then the norm weight; bit-identical to
// RmsNorm<bf16>), else a itself. Every thread of the 256 calls it (barriers).
template <Fold kFold>
__device__ __forceinline__ void StageActivationsF16(const Args& p, uint4* act16) {
  if constexpr (kFold == Fold::kNormIn) {
    bf16* staged = reinterpret_cast<bf16*>(act16);
    gemv_internal::StageRmsNorm<bf16, 1>(p.a, p.norm_weight, p.k, p.eps, staged, staged + p.k);
    StageF16(nullptr, p.k, act16);
  } else {
    StageF16(p.a, p.k, act16);
  }
}

// A kernel's static shared memory (the mma kernel's partial sums, StageRmsNorm's warp sums) counts
// against the same 48 KiB default as the dynamic staging: opt in whenever both together pass it
// (k = 24,576 staged, or 4 k = 48 KiB with the norm folded in, is the default alone).
template <typename Kernel>
absl::Status OptInPastTheDefaultSmem(Kernel kernel, size_t dynamic_bytes) {
  // Both kernels' static parts are < 8 KiB: below 40 KiB dynamic no query (one per launch).
  if (dynamic_bytes <= size_t{40} * 1024) return absl::OkStatus();
  cudaFuncAttributes attributes{};
  CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  if (dynamic_bytes + attributes.sharedSizeBytes <= size_t{48} * 1024) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(dynamic_bytes)));
  return absl::OkStatus();
}

// Fp8W16Math::kRing / kRing2 / kRingHalf (fp8_w8a16_ring_cuda.cu): the ring's stages for these
// arguments when a CTA may take 1 / smem_share of an SM's shared memory (0: the ring does not
// fit; the caller runs Fp8W16MmaKernel instead).
int RingStages(int rows_per_set, bool norm_in, int64_t k, int smem_share);

// Launches the ring kernel with `stages` (RingStages' answer) on a persistent grid of
// min(16-row tiles, SMs x ctas_per_sm) CTAs. Bit-identical to Fp8W16MmaKernel.
template <typename TOut, int R, Fold kFold>
absl::Status LaunchRing(const Args& p, TOut* out, cudaStream_t stream, bool pdl, int stages,
                        int ctas_per_sm);

}  // namespace tandem::kernels::cuda::fp8_w16_internal

#endif  // TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_DEVICE_CUH_
