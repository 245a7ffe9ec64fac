// Gated activations of the Llama/Qwen2 MLP (vLLM's SiluAndMul).
#ifndef TANDEM_KERNELS_LAYERS_ACTIVATION_H_
#define TANDEM_KERNELS_LAYERS_ACTIVATION_H_

#include <cstdint>

namespace tandem::kernels::cpu {

// out = silu(gate) * up, silu(x) = x / (1 + exp(-x)), computed in fp32.
// gate_up: [num_tokens, 2 * inter] (gate = first inter columns, up = last inter columns, the
// layout of a fused gate_up_proj); out: [num_tokens, inter]. out must not overlap gate_up.
// For large negative gates exp(-x) overflows to inf and silu gives -0, as in torch.
void SiluAndMul(const float* gate_up, int64_t num_tokens, int64_t inter, float* out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_LAYERS_ACTIVATION_H_
