#include "kernels/fp8/fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/linear.h"

namespace tandem::kernels {

absl::Status ValidateFp8Weight(const Fp8WeightView& w) {
  const Fp8ScaleGrid& g = w.grid;
  if (g.rows < 0 || g.cols < 0 || g.block_rows < 1 || g.block_cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 weight [", g.rows, ", ", g.cols, "] with scale blocks [", g.block_rows,
                     ", ", g.block_cols, "]: sizes must be >= 0 and blocks >= 1"));
  }
  if ((g.rows * g.cols > 0 && w.codes == nullptr) || w.scales == nullptr) {
    return absl::InvalidArgumentError("FP8 weight without codes or scales");
  }
  if (w.activation == Fp8ActivationScheme::kStaticTensor &&
      !(w.input_scale > 0.0f && std::isfinite(w.input_scale))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 static activation scale must be positive and finite, got ", w.input_scale));
  }
  return absl::OkStatus();
}

namespace cpu {
namespace {

// Activations as the FP8 product sees them: quantized by the scheme, then dequantized.
void QuantDequantActivations(const float* a, const Fp8WeightView& w, int64_t m, float* out) {
  const int64_t k = w.grid.cols;
  if (w.activation == Fp8ActivationScheme::kNone) {
    std::copy(a, a + m * k, out);
    return;
  }
  std::vector<uint8_t> codes(static_cast<size_t>(m * k));
  std::vector<float> scales(static_cast<size_t>(NumActivationScales(w.activation, m, k)));
  QuantizeActivations(a, m, k, w.activation, w.input_scale, codes.data(), scales.data());
  const int64_t groups = k == 0 ? 0 : (k + 127) / 128;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      float scale = scales[0];
      if (w.activation == Fp8ActivationScheme::kDynamicToken) scale = scales[r];
      if (w.activation == Fp8ActivationScheme::kDynamicGroup128) {
        scale = scales[r * groups + c / 128];
      }
      out[r * k + c] = Fp8E4m3ToFloat(codes[r * k + c]) * scale;
    }
  }
}

}  // namespace

void DequantizeFp8Weight(const Fp8WeightView& w, int64_t row_begin, int64_t num_rows, float* out) {
  const Fp8ScaleGrid& g = w.grid;
  const int64_t gc = g.GridCols();
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row = row_begin + r;
    const float* scale_row = w.scales + (row / g.block_rows) * gc;
    const uint8_t* codes = w.codes + row * g.cols;
    for (int64_t c = 0; c < g.cols; ++c) {
      out[r * g.cols + c] = Fp8E4m3ToFloat(codes[c]) * scale_row[c / g.block_cols];
    }
  }
}

absl::Status Fp8Linear(const float* a, const Fp8WeightView& w, const float* bias, int64_t m,
                       float* out, ThreadPool* pool) {
  if (absl::Status s = ValidateFp8Weight(w); !s.ok()) return s;
  const int64_t n = w.grid.rows, k = w.grid.cols;
  if (m == 0 || n == 0) return absl::OkStatus();
  std::vector<float> act(static_cast<size_t>(m * k));
  QuantDequantActivations(a, w, m, act.data());
  // The weight is dequantized a chunk of rows at a time (~16 MiB of fp32) to bound memory.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, (int64_t{4} << 20) / (k + 1)));
  std::vector<float> rows(static_cast<size_t>(chunk * k));
  std::vector<float> partial(chunk == n ? 0 : static_cast<size_t>(m * chunk));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t count = std::min(chunk, n - r0);
    DequantizeFp8Weight(w, r0, count, rows.data());
    const float* chunk_bias = bias == nullptr ? nullptr : bias + r0;
    if (count == n) {
      Linear(act.data(), rows.data(), chunk_bias, m, n, k, out, pool);
      continue;
    }
    Linear(act.data(), rows.data(), chunk_bias, m, count, k, partial.data(), pool);
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(partial.data() + i * count, count, out + i * n + r0);
    }
  }
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace tandem::kernels
