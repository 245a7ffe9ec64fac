// The register-pipelined decode FP8 GEMV (fp8_gemv_cuda.h, Fp8GemvKernel::kPipelined; kAuto's
// choice for e4m3 codes at 2 <= m <= 8 with scales constant along k).
//
// Why a third kernel (BENCHMARKS.md): the register-load kernel issues its weight loads in bursts
// (a few groups, wait, compute, issue again), so a warp has nothing in flight while it computes;
// the streaming kernel keeps a cp.async ring full but spends ~300 instructions per 2 KB item
// (64-bit divisions and index math, 48 e4m3 -> f16 conversions), and its division-free rewrite
// compiled, with the L2 evict-first hint, to an LDGSTS form the H200 refused (illegal
// instruction). Here, as in the bf16 SmallMLinear (gemv_cuda.cu) that reads 4.3-4.5 TB/s:
//   * a block of kWarps warps owns one 16-row tile; warp w takes the 128-column groups w,
//     w + kWarps, ...; each lane keeps kDepth groups of its weight bytes in flight IN
//     REGISTERS (plain 16-byte evict-first loads): group j + kDepth is loaded as soon as group
//     j's registers are consumed, so a warp is never without loads in flight while it has
//     groups left; the first kDepth groups are requested before the PDL wait (kPipelined; the
//     other forms issue fewer there: fp8_gemv_cuda.h);
//   * addresses are a row pointer per lane made once plus a 32-bit column: no 64-bit index math
//     in the loop, no shared memory until the final reduction;
//   * the weight codes become f16 with integer operations (sign bit kept, exponent and mantissa
//     shifted into place: exactly the code times 2^-8, subnormals included, which the tensor
//     cores take as they are; the 2^8 is applied once per output), not with the conversion
//     instruction, whose throughput on Hopper is low; the activation codes (a third of the
//     bytes of an item) still use it, so the two run on different pipes;
//   * products on the tensor cores (mma m16n8k16 f16 -> f32), each 128-column group summed on
//     its own and then added to the fp32 accumulators (as the other two kernels), the warps'
//     sums met in shared memory, per-row / per-token scales and the bias applied once.
// Fragment layout (fp8_gemv_device.cuh): lane (g, t) holds 16 bytes of weight rows g and g + 8
// and of token g's codes at columns 16 t + 64 ch of each group; in each 32-bit word i of those
// the bytes 0, 2 are the f16 pair of k = 2t, 2t + 1 and bytes 1, 3 that of k = 2t + 8, 2t + 9 of
// one m16n8k16 step, for the weight rows and the token alike. Rows past n and tokens past m read
// row n - 1 / token m - 1 (their outputs are never written); columns past k are zeros.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_gemv_internal {
namespace {

constexpr int kDepth = 4;  // 128-column groups of weight loads in flight per warp
// The products carry the weight's 2^-8 (E4m3x4ToF16Scaled): undone once per output.
constexpr float kUnscale = 256.0f;

// e4m3 codes b0..b3 (low byte first) as f16 pairs times 2^-8: lo = (b0, b2), hi = (b1, b3). An
// e4m3 code's 7 exponent and mantissa bits, one place lower in a 16-bit half, are an f16 with
// the code's exponent field read with f16's bias (15, not 7): the value times 2^-8, exactly, for
// every finite code (the 8 subnormal codes become f16 subnormals).
__device__ __forceinline__ void E4m3x4ToF16Scaled(uint32_t q, uint32_t& lo, uint32_t& hi) {
  hi = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 1);
  const uint32_t r = q << 8;
  lo = (r & 0x80008000u) | ((r & 0x7F007F00u) >> 1);
}

// The same pairs without the scale, through the conversion instruction: lo = (b0, b2), hi =
// (b1, b3), exact.
__device__ __forceinline__ void E4m3x4ToF16(uint32_t q, uint32_t& lo, uint32_t& hi) {
  const uint32_t r = __byte_perm(q, 0u, 0x3120u);  // b0, b2, b1, b3
  const __half2_raw l =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r & 0xffffu), __NV_E4M3);
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  hi = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// What one lane streams: its weight rows g and g + 8 and token g's codes, each from column 16 t.
struct LaneRows {
  const uint8_t* w0;
  const uint8_t* w1;
  const uint8_t* a;
  int lane_col, k;
};

// 16 bytes at byte `col` of a row the lane streams: as they are in a whole group (kTail false);
// in the partial last group, zeros from column k on (nothing read there).
template <bool kTail>
__device__ __forceinline__ uint4 LoadWeight(const LaneRows& r, const uint8_t* row, uint32_t col) {
  if (kTail && static_cast<int>(col) + r.lane_col >= r.k) return make_uint4(0, 0, 0, 0);
  return __ldcs(reinterpret_cast<const uint4*>(row + col));
}
template <bool kTail>
__device__ __forceinline__ uint4 LoadCodes(const LaneRows& r, uint32_t col) {
  if (kTail && static_cast<int>(col) + r.lane_col >= r.k) return make_uint4(0, 0, 0, 0);
  return __ldg(reinterpret_cast<const uint4*>(r.a + col));
}

// The lane's weight chunks of group gi: [ch * 2 + h] = row g + 8 h, columns 128 gi + 64 ch.
template <bool kTail>
__device__ __forceinline__ void LoadGroup(const LaneRows& r, int gi, uint4 (&w)[4]) {
  const uint32_t col = static_cast<uint32_t>(gi) * kGroup;
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
    w[ch * 2] = LoadWeight<kTail>(r, r.w0, col + 64 * ch);
    w[ch * 2 + 1] = LoadWeight<kTail>(r, r.w1, col + 64 * ch);
  }
}

// acc += group gi's products: its weight chunks w (LoadGroup) with token g's codes.
template <bool kTail>
__device__ __forceinline__ void UseGroup(const LaneRows& r, int gi, const uint4 (&w)[4],
                                         float (&acc)[4]) {
  const uint32_t col = static_cast<uint32_t>(gi) * kGroup;
  float gacc[4] = {};
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
    const uint4 av = LoadCodes<kTail>(r, col + 64 * ch);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t a[4], b_lo, b_hi;
      E4m3x4ToF16Scaled(Word(w[ch * 2], i), a[0], a[2]);      // row g
      E4m3x4ToF16Scaled(Word(w[ch * 2 + 1], i), a[1], a[3]);  // row g + 8
      E4m3x4ToF16(Word(av, i), b_lo, b_hi);
      internal::Mma16816<__half>(gacc, a, b_lo, b_hi);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += gacc[i];
}

// `bytes` (a multiple of 16) from 16-byte aligned `src` into L2, nothing into registers.
__device__ __forceinline__ void PrefetchL2(const uint8_t* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes));
#endif
}

// Block x: tile x (rows 16 x .. 16 x + 15) for all m <= 8 tokens. The whole 128-column groups
// run through the pipeline; a partial last group (k % 128 != 0) is its warp's last, unpipelined.
template <int kWarps, typename TOut>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)
    PipelineKernel(const __grid_constant__ Params p, TOut* __restrict__ out) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float partial[kWarps][4 * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = blockIdx.x;
  const int k = static_cast<int>(p.k);
  const int whole = k / kGroup;  // groups of 128 columns; a partial one after them
  LaneRows r;
  r.lane_col = 16 * t;
  r.k = k;
  r.w0 = p.w + std::min<int64_t>(tile * 16 + g, p.n - 1) * p.k + r.lane_col;
  r.w1 = p.w + std::min<int64_t>(tile * 16 + 8 + g, p.n - 1) * p.k + r.lane_col;
  // Kept in registers as pointers (else the compiler re-adds p.w from the constant bank on
  // every load).
  asm volatile("" : "+l"(r.w0), "+l"(r.w1));
  uint4 wv[kDepth][4];
  // Stages [from, to) of the pipeline's first kDepth groups into registers.
  const auto load_first = [&](int from, int to) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (s >= from && s < to && warp + s * kWarps < whole) {
        LoadGroup<false>(r, warp + s * kWarps, wv[s]);
      }
    }
  };
  // The weights are never written by a preceding kernel: the first p.early_groups groups' loads,
  // or the L2 prefetch of the block's first kDepth groups a warp, may overlap its tail (the fewer
  // bytes in flight early, the less the GEMV slows that producer: BENCHMARKS.md).
  if (p.early_l2_prefetch && threadIdx.x < 16) {
    const int64_t row = std::min<int64_t>(tile * 16 + threadIdx.x, p.n - 1);
    PrefetchL2(p.w + row * p.k, static_cast<uint32_t>(std::min(k, kDepth * kWarps * kGroup)));
  }
  load_first(0, p.early_groups);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  load_first(p.early_groups, kDepth);
  r.a = p.a_codes + int64_t{std::min(g, p.m - 1)} * p.k + r.lane_col;
  asm volatile("" : "+l"(r.a));
  float acc[4] = {};
  for (int base = warp; base < whole; base += kDepth * kWarps) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      const int gi = base + s * kWarps;
      if (gi >= whole) break;
      UseGroup<false>(r, gi, wv[s], acc);
      // Stage s's registers are consumed: they take the group kDepth ahead.
      if (gi + kDepth * kWarps < whole) LoadGroup<false>(r, gi + kDepth * kWarps, wv[s]);
    }
  }
  if (k % kGroup != 0 && warp == whole % kWarps) {
    LoadGroup<true>(r, whole, wv[0]);
    UseGroup<true>(r, whole, wv[0], acc);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) partial[warp][i * 32 + lane] = acc[i];
  __syncthreads();
  for (int idx = threadIdx.x; idx < 4 * 32; idx += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[w][idx];
    Finish<ActForm::kCodes, 1>(p, tile, idx, v * kUnscale, out);
  }
}

template <int kWarps, typename TOut>
cudaError_t Launch(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>((p.n + 15) / 16)),
                                         dim3(kWarps * 32), stream, pdl);
  return cudaLaunchKernelEx(config.get(), PipelineKernel<kWarps, TOut>, p, out);
}

}  // namespace

bool PipelineApplies(const Params& p) {
  return p.a_codes != nullptr && p.m <= 8 && !p.group_scales && p.k < (int64_t{1} << 30);
}

// 8 warps a block while n / 16 blocks fill an H200's 132 SMs twice over at most (more warps on
// few tiles), else 4 (more groups per warp: the pipeline runs longer between its fill and drain).
template <typename TOut>
cudaError_t LaunchPipeline(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  constexpr int64_t kEightWarpsMaxRows = 2 * 132 * 16;
  return p.n <= kEightWarpsMaxRows ? Launch<8, TOut>(p, out, stream, pdl)
                                   : Launch<4, TOut>(p, out, stream, pdl);
}

template cudaError_t LaunchPipeline<__nv_bfloat16>(const Params&, __nv_bfloat16*, cudaStream_t,
                                                   bool);
template cudaError_t LaunchPipeline<float>(const Params&, float*, cudaStream_t, bool);

}  // namespace tandem::kernels::cuda::fp8_gemv_internal
