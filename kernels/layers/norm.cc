#include "kernels/layers/norm.h"

#include <cmath>

namespace tandem::kernels::cpu {
namespace {

// 1 / sqrt(mean(row^2) + eps). fp64 accumulation keeps the variance exact to fp32 precision
// for any hidden size (HF accumulates in fp32; fp64 is "fp32 or better").
float InverseRms(const float* row, int64_t hidden, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < hidden; ++i) sum_sq += static_cast<double>(row[i]) * row[i];
  const double variance = sum_sq / static_cast<double>(hidden);
  return static_cast<float>(1.0 / std::sqrt(variance + static_cast<double>(eps)));
}

// Reads row fully (InverseRms) before writing, so out == row is safe.
void NormalizeRow(const float* row, const float* weight, int64_t hidden, float eps, float* out) {
  const float inv_rms = InverseRms(row, hidden, eps);
  for (int64_t i = 0; i < hidden; ++i) out[i] = weight[i] * (row[i] * inv_rms);
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t num_tokens, int64_t hidden, float eps,
             float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    NormalizeRow(x + t * hidden, weight, hidden, eps, out + t * hidden);
  }
}

void FusedAddRmsNorm(float* x, float* residual, const float* weight, int64_t num_tokens,
                     int64_t hidden, float eps) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* x_row = x + t * hidden;
    float* res_row = residual + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) res_row[i] += x_row[i];
    NormalizeRow(res_row, weight, hidden, eps, x_row);
  }
}

}  // namespace tandem::kernels::cpu
