// RMSNorm as in Hugging Face LlamaRMSNorm / Qwen2RMSNorm, and vLLM's fused residual-add variant.
//
// All tensors are fp32, row-major. Stateless functions; safe to call concurrently on disjoint
// outputs.
#ifndef TANDEM_KERNELS_LAYERS_NORM_H_
#define TANDEM_KERNELS_LAYERS_NORM_H_

#include <cstdint>

namespace tandem::kernels::cpu {

// out = x * rsqrt(mean(x^2) + eps) * weight, per token.
// x, out: [num_tokens, hidden]; weight: [hidden]. out may alias x (exactly, not partially).
// The mean of squares is accumulated in fp64; the two multiplies happen in fp32 in HF's order
// ((x * inv_rms) * weight) so results match transformers to a few ulp.
void RmsNorm(const float* x, const float* weight, int64_t num_tokens, int64_t hidden, float eps,
             float* out);

// vLLM's fused_add_rms_norm, both updates in place:
//   residual = residual + x;  x = RmsNorm(residual) (with weight).
// x, residual: [num_tokens, hidden]; weight: [hidden]. x and residual must not overlap.
void FusedAddRmsNorm(float* x, float* residual, const float* weight, int64_t num_tokens,
                     int64_t hidden, float eps);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_LAYERS_NORM_H_
