// FP8 activation quantization (per token; 1 x 128 groups after RMSNorm) fused into the kernels
// that produce the activations
// (issue 38): RMSNorm (plain, or with vLLM's residual add) and SiLU-and-mul write the e4m3 codes
// and per-token scales of their bf16 output themselves, so the FP8 projection that follows
// needs no separate QuantizeActivations pass (one kernel and one read of the row fewer per
// projection; at decode batch 1 on Llama-3-8B that is 3 of the 4 passes of every layer).
//
// Bit for bit what the two kernels in sequence give: kernels/layers/cuda's RmsNorm /
// FusedAddRmsNorm / SiluAndMul (the same fp32 arithmetic, block size and reduction order), then
// QuantizeActivations (fp8_cuda.h) with kDynamicToken on their ROUNDED bf16 output: scale =
// max|row| / 448 (1 for a zero row), codes = e4m3(value / scale) with an IEEE division, round to
// nearest even, saturating. (Quantizing the bf16 rounding rather than the fp32 value keeps the
// CUDA model's numbers unchanged by the fusion.)
//
// RMSNorm: one block of 256 threads per token, the row held in registers. SiLU-and-mul: a
// cluster of 8 blocks per token (one block alone was compute-bound on its SM: slower than the
// two kernels at decode), their amax combined through distributed shared memory (sm_90).
// Width (hidden / inter) a multiple of 8 and at most kFp8FusedQuantMaxWidth; 16-byte aligned
// pointers.
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
// programmatic_launch: launched with PDL (the kernel waits for the preceding grid before it
// reads anything), as kernels/layers/cuda's.
#ifndef TANDEM_KERNELS_FP8_FP8_FUSED_QUANT_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_FUSED_QUANT_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kFp8FusedQuantMaxWidth = 16384;

// Where the quantized output goes: codes [m, width] e4m3, scales [m] fp32 per token, or with
// group128 one per 1 x 128 group, [m, ceil(width / 128)] (QuantizeActivations' kDynamicGroup128
// layout: DeepSeek-style block-FP8 weights' activations). group128 is RmsNormQuantFp8's only.
struct Fp8TokenCodes {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  bool group128 = false;
  // group128 only: > 0 writes the scales group-major, [groups, group_major_ld] with ld >= m
  // (kernels/fp8/fp8.h Fp8GroupScaleIndex: the block-scaled GEMM's layout, no transpose).
  int64_t group_major_ld = 0;
};

// True when the fused kernels take rows of `width` elements.
bool Fp8FusedQuantSupported(int64_t width);

// residual == nullptr: out = RmsNorm(x) (layers_cuda.h's RmsNorm). Else FusedAddRmsNorm's:
// residual = bf16(residual + x); out = RmsNorm(residual) (out may be x, as FusedAddRmsNorm
// writes it in place). Then q = per-token e4m3 of out, or with q.group128 per 1 x 128 group (a
// half-warp holds a group: 16 threads x one 16-byte vector; QuantizeActivations' kDynamicGroup128
// bits). x, residual, out: [m, hidden];
// weight: [hidden]. INVALID_ARGUMENT (nothing launched) for m < 0, an unsupported hidden,
// null or unaligned pointers.
absl::Status RmsNormQuantFp8(const __nv_bfloat16* x, __nv_bfloat16* residual,
                             const __nv_bfloat16* weight, int64_t m, int64_t hidden, float eps,
                             __nv_bfloat16* out, const Fp8TokenCodes& q, cudaStream_t stream,
                             bool programmatic_launch = false);

// out = bf16(silu(gate) * up) as layers_cuda.h's SiluAndMul (skipped when out is null: the
// FP8 projection reads only the codes), q = per-token e4m3 of that bf16 output.
// gate_up: [m, 2 * inter] (gate first); out: [m, inter]. INVALID_ARGUMENT as above, and for
// q.group128 (a cluster block's vectors need not start on a group: not fused).
absl::Status SiluAndMulQuantFp8(const __nv_bfloat16* gate_up, int64_t m, int64_t inter,
                                __nv_bfloat16* out, const Fp8TokenCodes& q, cudaStream_t stream,
                                bool programmatic_launch = false);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_FUSED_QUANT_CUDA_H_
