#include "kernels/layers/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kernels {
namespace {

// transformers' _compute_default_rope_parameters, op for op in fp32:
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
// The exponent is an fp32 division, the power an fp32 pow (torch's is within 1 ulp; ours is
// computed in fp64 and rounded once, so correctly rounded in all but double-rounding ties), and
// `1.0 / t` is torch's reciprocal, an fp32 division.
std::vector<float> DefaultInvFreq(double theta, int64_t rotary_dim) {
  const float base = static_cast<float>(theta);  // torch computes scalar ** fp32 tensor in fp32
  const float dim = static_cast<float>(rotary_dim);
  std::vector<float> inv_freq(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    const float power = static_cast<float>(std::pow(static_cast<double>(base), exponent));
    inv_freq[i] = 1.0f / power;
  }
  return inv_freq;
}

// transformers' _compute_llama3_parameters, with each tensor op emulated in fp32 as torch does
// it: python scalars are cast to fp32 for the op, `scalar / t` is reciprocal(t) * scalar, and
// comparisons against python floats happen in fp32.
void ApplyLlama3Scaling(const RopeScaling& s, std::vector<float>& inv_freq) {
  const float factor = static_cast<float>(s.factor);
  const float low_freq_factor = static_cast<float>(s.low_freq_factor);
  const float old_context_len = static_cast<float>(s.original_max_position_embeddings);
  // These two are python floats (fp64) in transformers, compared against an fp32 tensor.
  const float low_freq_wavelen = static_cast<float>(
      static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(
      static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor);
  const float freq_factor_span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);

  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * two_pi;
    // wavelen > low_freq_wavelen: divide by factor; wavelen < high_freq_wavelen: keep.
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (is_medium) {
      // Smooth interpolation between the two regimes.
      const float smooth =
          ((1.0f / wavelen) * old_context_len - low_freq_factor) / freq_factor_span;
      f = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
}

// transformers' _compute_yarn_parameters, fp32 tensor ops emulated in fp32; the correction range
// is python float math (fp64).
void ApplyYarnScaling(const RopeScaling& s, double theta, int64_t dim,
                      std::vector<float>& inv_freq) {
  const double two_pi = 2.0 * std::numbers::pi;
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) *
            std::log(static_cast<double>(s.original_max_position_embeddings) /
                     (rotations * two_pi))) /
           (2.0 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a singularity
  const float factor = static_cast<float>(s.factor);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float extrapolation = inv_freq[i];  // 1 / pos_freqs
    const float pos_freq = 1.0f / extrapolation;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq[i] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

}  // namespace

double YarnGetMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double RopeAttentionFactor(const RopeScaling& s) {
  if (s.type != RopeType::kYarn) return 1.0;
  if (s.attention_factor > 0.0) return s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    return YarnGetMscale(s.factor, s.mscale) / YarnGetMscale(s.factor, s.mscale_all_dim);
  }
  return YarnGetMscale(s.factor, 1.0);
}

absl::StatusOr<std::vector<float>> ComputeRopeInvFreq(double theta, int64_t rotary_dim,
                                                      const RopeScaling& scaling) {
  if (!(theta > 0.0) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: theta must be finite and > 0, got ", theta));
  }
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: rotary_dim must be positive and even, got ", rotary_dim));
  }
  if (scaling.type != RopeType::kDefault &&
      (!(scaling.factor > 0.0) || !std::isfinite(scaling.factor))) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: scaling factor must be finite and > 0, got ", scaling.factor));
  }
  if (scaling.type == RopeType::kLlama3) {
    if (!(scaling.low_freq_factor > 0.0) || !std::isfinite(scaling.high_freq_factor) ||
        !(scaling.high_freq_factor > scaling.low_freq_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope: llama3 needs 0 < low_freq_factor < high_freq_factor (finite), got "
                       "low_freq_factor=",
                       scaling.low_freq_factor, " high_freq_factor=", scaling.high_freq_factor));
    }
    if (scaling.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope: llama3 original_max_position_embeddings must be > 0, got ",
                       scaling.original_max_position_embeddings));
    }
  }

  std::vector<float> inv_freq = DefaultInvFreq(theta, rotary_dim);
  switch (scaling.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear: {
      // _compute_linear_scaling_rope_parameters: inv_freq /= factor (fp32).
      const float factor = static_cast<float>(scaling.factor);
      for (float& f : inv_freq) f /= factor;
      break;
    }
    case RopeType::kLlama3:
      ApplyLlama3Scaling(scaling, inv_freq);
      break;
    case RopeType::kYarn:
      if (scaling.original_max_position_embeddings <= 0 || !(scaling.beta_fast > 0.0) ||
          !(scaling.beta_slow > 0.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rope: yarn needs original_max_position_embeddings, beta_fast, beta_slow > 0, got ",
            scaling.original_max_position_embeddings, ", ", scaling.beta_fast, ", ",
            scaling.beta_slow));
      }
      ApplyYarnScaling(scaling, theta, rotary_dim, inv_freq);
      break;
  }
  return inv_freq;
}

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {
namespace {

// Rotate-half on one head: x' = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
// Same fp32 operation order as transformers' apply_rotary_pos_emb.
void RotateHead(const float* cos, const float* sin, int64_t half, float* x) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] + (-x2) * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

void ApplyRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
               int64_t head_dim, float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(half));
  std::vector<float> sin(static_cast<size_t>(half));
  for (int64_t t = 0; t < num_tokens; ++t) {
    // transformers forms the angle as an fp32 product (inv_freq @ position_ids in fp32, K = 1),
    // so large positions carry the same fp32 angle rounding here as there.
    const float position = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(inv_freq[i] * position);
      cos[i] = static_cast<float>(std::cos(angle));
      sin[i] = static_cast<float>(std::sin(angle));
    }
    float* q_token = q + t * num_q_heads * head_dim;
    for (int64_t h = 0; h < num_q_heads; ++h)
      RotateHead(cos.data(), sin.data(), half, q_token + h * head_dim);
    float* k_token = k + t * num_kv_heads * head_dim;
    for (int64_t h = 0; h < num_kv_heads; ++h)
      RotateHead(cos.data(), sin.data(), half, k_token + h * head_dim);
  }
}

}  // namespace tandem::kernels::cpu
