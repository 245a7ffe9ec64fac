#include "kernels/layers/activation.h"

#include <cmath>

namespace tandem::kernels::cpu {

void SiluAndMul(const float* gate_up, int64_t num_tokens, int64_t inter, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = gate_up + t * 2 * inter;
    const float* up = gate + inter;
    float* out_row = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate[i];
      out_row[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

}  // namespace tandem::kernels::cpu
