// Rotary position embedding (RoPE), rotate-half form as in Hugging Face transformers.
//
// The frequency table depends only on the model config, so it is computed once
// (ComputeRopeInvFreq) and shared by every layer and step; ApplyRope rotates q and k in place.
#ifndef TANDEM_KERNELS_LAYERS_ROPE_H_
#define TANDEM_KERNELS_LAYERS_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::kernels {

enum class RopeType {
  kDefault,  // inv_freq[i] = theta^(-2i / rotary_dim)
  kLinear,   // default / factor (position interpolation)
  kLlama3,   // Llama 3.1 wavelength-dependent scaling
  kYarn,     // YaRN (DeepSeek-V2/V3): ramp between interpolated and extrapolated frequencies
};

// Mirrors transformers' rope_scaling / rope_parameters fields.
struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;                              // linear, llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  double beta_fast = 32.0;                          // yarn
  double beta_slow = 1.0;                           // yarn
  double mscale = 0.0;                              // yarn; 0 = absent
  double mscale_all_dim = 0.0;                      // yarn (also scales DeepSeek's softmax)
  double attention_factor = 0.0;                    // yarn; 0 = derived (RopeAttentionFactor)
  bool truncate = true;                             // yarn: integer correction range
};

// YaRN's get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double YarnGetMscale(double scale, double mscale);

// The factor transformers multiplies cos/sin by (rotary_emb.attention_scaling): 1 except for
// yarn, where it is attention_factor, or else get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) when both are set, or else get_mscale(factor).
double RopeAttentionFactor(const RopeScaling& scaling);

// inv_freq: [rotary_dim / 2], computed as transformers does (fp32 result): each torch fp32 op of
// _compute_default_rope_parameters / _compute_linear_scaling_rope_parameters /
// _compute_llama3_parameters / _compute_yarn_parameters is emulated in fp32 (pow is evaluated in
// fp64 and rounded once, so results agree with torch to within torch's own 1-ulp pow).
// INVALID_ARGUMENT for non-finite or non-positive theta, odd or non-positive rotary_dim,
// non-finite or non-positive factor (linear, llama3), or llama3 without
// 0 < low_freq_factor < high_freq_factor or with original_max_position_embeddings <= 0.
absl::StatusOr<std::vector<float>> ComputeRopeInvFreq(double theta, int64_t rotary_dim,
                                                      const RopeScaling& scaling);

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {

// Rotates q and k in place (rotate-half: x' = x * cos + rotate_half(x) * sin, with
// cos/sin of positions[t] * inv_freq duplicated over both halves), rotary_dim == head_dim.
// The angle is the fp32 product positions[t] * inv_freq[i], as in transformers; cos/sin are
// evaluated in fp64 and rounded to fp32. head_dim must be even.
// positions: [num_tokens]; inv_freq: [head_dim / 2];
// q: [num_tokens, num_q_heads, head_dim]; k: [num_tokens, num_kv_heads, head_dim].
void ApplyRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
               int64_t head_dim, float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_LAYERS_ROPE_H_
