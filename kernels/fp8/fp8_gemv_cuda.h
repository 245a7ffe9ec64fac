// The decode FP8 linear layer (issue 38): out[m, n] = a[m, k] . w[n, k]^T (+ bias[n]) for
// m <= kFp8SmallMMaxM rows, with an e4m3 weight whose scales are per row over blocks of 128
// columns or the whole row (fp8_cuda.h's Fp8DeviceWeight). Decode reads every weight once per
// step, so the cost is the weight bytes over the memory bandwidth; both kernels read each weight
// byte ONCE for all m rows. Three kernels (Fp8GemvKernel):
//   * kPipelined (fp8_gemv_pipeline_cuda.cu; kAuto's choice for e4m3 codes at 2 <= m <= 8 with
//     per-row weight and per-token / static activation scales, and as kPipelinedOneEarly at
//     m = 1 for weights with n, k >= 8192): a block's warps split a 16-row tile's 128-column
//     groups, each lane keeping the next 4 groups' weight bytes in flight in
//     registers (16-byte loads, no cp.async, 32-bit column offsets), the weight codes made f16
//     with integer operations (exactly 2^-8 times the value; the 2^8 applied once per output),
//     the activation codes with the conversion instruction, m16n8k16 f16 MMAs;
//   * kStreaming (fp8_gemv_stream_cuda.cu; kAuto's choice at m = 1 for smaller weights, and for
//     weight-only FP8 at m <= 8, with per-row scales): codes or weight-only FP8. Each lane streams
//     its fragment bytes with cp.async into a private 3-stage ring in shared memory (weights,
//     activations and per-group scales of the next groups always in flight, ~60 registers),
//     (16-row tile, 128-column group) items over a one-wave persistent grid, and a cluster of 2
//     blocks splitting k where there are too few tiles, reduced through distributed shared
//     memory. Same fragments and numerics as the register kernel below.
//   * kRegisterLoads (fp8_gemv_cuda.cu; kAuto's choice otherwise; the only one for the fused
//     quantization):
//     * a block owns 16 or 32 weight rows; its 4 or 8 warps split k in groups of 128 columns; a
//     lane
//       streams 16 bytes of a weight row per 64 columns (16-byte loads, evict-first);
//     * the products run on the tensor cores, the weight as the 16-row A operand and the m <= 16
//       activation rows as one or two 8-column B operands (mma.m16n8k32 e4m3 x e4m3, or m16n8k16
//       bf16 for weight-only FP8 with the weight converted exactly to bf16). A dot product does
//       not care in which order k is summed, so k is permuted inside each 64-column chunk such
//       that a lane's 16 contiguous weight bytes and the activations' 16 contiguous bytes form its
//       fragments directly: no shared memory, no shuffles;
//     * each 128-column group is summed on the tensor cores, then added to fp32 accumulators with
//       its scales when they change per group (128-column weight blocks, 1 x 128 activation
//       groups): Hopper's FP8 MMA keeps about 14 bits while accumulating (DeepSeek-V3 report,
//       3.3.2), so the fp32 promotion every 128 columns bounds that error;
//     * the warps' partial sums meet in shared memory; per-row weight and per-token activation
//       scales and the bias are applied once, one rounding to TOut.
// Activations come in one of three forms (Fp8SmallMActivations):
//   * weight-only FP8 (scheme kNone): bf16 values;
//   * e4m3 codes and scales QuantizeActivations (fp8_cuda.h) wrote;
//   * bf16 values with a quantizing scheme and no codes: the quantization is FUSED into the
//     kernel (no separate pass, no codes in memory): static scale as given; per token, a
//     prologue in every block reads the m rows once for their amax; 1 x 128 groups, the group's
//     amax inside the warp that owns it. The codes are QuantizeActivations' bit for bit (amax /
//     448, an IEEE division, round to nearest even with saturation).
// Numerics are cpu::Fp8Linear's (fp8_linear.h) up to fp32 summation order.
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
// programmatic_launch: as SmallMLinear's (kernels/gemm/cuda/gemv_cuda.h): the kernel waits for the
// preceding grid before it reads activations, scales or bias or writes out. With
// early_weight_loads its first weight loads are issued before that wait (they overlap the
// preceding kernel's tail), so the preceding grid must not write the weight codes (no model
// does); false issues them after it, as SmallMLinear does (for comparisons).
#ifndef TANDEM_KERNELS_FP8_FP8_GEMV_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_GEMV_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kFp8SmallMMaxM = 16;

// Which kernel Fp8SmallMLinear runs (the header comment); activations quantized inside the
// kernel always take kRegisterLoads, and kPipelined runs only e4m3 codes at m <= 8 with scales
// constant along k (kAuto's choice otherwise). kAuto: Fp8GemvAutoKernel's choice.
// The kPipelined* forms differ only in what a block issues before its PDL wait (with
// early_weight_loads; same bits out): kPipelined its first 4 groups of weight loads per warp
// into registers; kPipelinedOneEarly the first group only (the other 3 after the wait);
// kPipelinedPrefetchL2 none into registers, the block's first 4 groups per warp prefetched into
// L2 (cp.async.bulk.prefetch.L2, one per weight row); kPipelinedLate nothing.
enum class Fp8GemvKernel {
  kAuto,
  kStreaming,
  kRegisterLoads,
  kPipelined,
  kPipelinedOneEarly,
  kPipelinedPrefetchL2,
  kPipelinedLate
};

// True for the kPipelined* forms.
constexpr bool IsPipelinedGemv(Fp8GemvKernel kernel) {
  return kernel == Fp8GemvKernel::kPipelined || kernel == Fp8GemvKernel::kPipelinedOneEarly ||
         kernel == Fp8GemvKernel::kPipelinedPrefetchL2 || kernel == Fp8GemvKernel::kPipelinedLate;
}

// The kernel kAuto runs for m rows of an n x k weight (group_scales: scales change every 128
// columns), from the measured table in BENCHMARKS.md.
Fp8GemvKernel Fp8GemvAutoKernel(int64_t m, int64_t n, int64_t k, bool group_scales);

// The activations of one Fp8SmallMLinear call (see the header comment for the three forms).
struct Fp8SmallMActivations {
  Fp8ActivationScheme scheme = Fp8ActivationScheme::kNone;
  const __nv_bfloat16* values = nullptr;  // [m, k]: kNone, or quantized inside the kernel
  const uint8_t* codes = nullptr;         // [m, k] e4m3, or null to quantize `values`
  const float* scales = nullptr;          // with codes: NumActivationScales(scheme, m, k)
  float static_scale = 0.0f;              // kStaticTensor without codes: the scale (> 0)
};

// True when Fp8SmallMLinear takes these arguments: 1 <= m <= kFp8SmallMMaxM, k a positive
// multiple of 16, block_rows 1 and block_cols 128 or k, 16-byte aligned weight codes and
// activations, the pointers the activation form needs, a positive static scale to fuse.
bool Fp8SmallMLinearSupported(const Fp8SmallMActivations& a, const Fp8DeviceWeight& w, int64_t m);

// a: [m, k]; w: [n, k]; bias: [n] bf16 or null; out: [m, n] of TOut (bf16 or float), not
// overlapping the inputs. INVALID_ARGUMENT (nothing launched) unless Fp8SmallMLinearSupported
// and out is non-null.
template <typename TOut>
absl::Status Fp8SmallMLinear(const Fp8SmallMActivations& a, const Fp8DeviceWeight& w,
                             const __nv_bfloat16* bias, int64_t m, TOut* out, cudaStream_t stream,
                             bool programmatic_launch = false, bool early_weight_loads = true,
                             Fp8GemvKernel kernel = Fp8GemvKernel::kAuto);

extern template absl::Status Fp8SmallMLinear<__nv_bfloat16>(const Fp8SmallMActivations&,
                                                            const Fp8DeviceWeight&,
                                                            const __nv_bfloat16*, int64_t,
                                                            __nv_bfloat16*, cudaStream_t, bool,
                                                            bool, Fp8GemvKernel);
extern template absl::Status Fp8SmallMLinear<float>(const Fp8SmallMActivations&,
                                                    const Fp8DeviceWeight&, const __nv_bfloat16*,
                                                    int64_t, float*, cudaStream_t, bool, bool,
                                                    Fp8GemvKernel);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_GEMV_CUDA_H_
