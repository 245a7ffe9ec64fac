#include "kernels/fp8/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace tandem::kernels {
namespace {

constexpr int64_t kGroup = 128;  // DeepSeek's activation group width

std::array<float, 256> MakeDecodeTable() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 0xF;
    const int mantissa = code & 0x7;
    float v;
    if ((code & 0x7F) == 0x7F) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      v = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
    } else {
      v = std::ldexp(static_cast<float>(8 + mantissa), exponent - 7 - 3);
    }
    table[code] = (code & 0x80) ? -v : v;
  }
  return table;
}

const std::array<float, 256>& DecodeTable() {
  static const std::array<float, 256> table = MakeDecodeTable();  // immutable once built
  return table;
}

// x / scale quantized to a code (a division, as torch's reference quantizers do).
uint8_t QuantizeScaled(float x, float scale) { return FloatToFp8E4m3(x / scale); }

float ScaleFor(float amax) { return amax > 0.0f ? amax / kFp8E4m3Max : 1.0f; }

}  // namespace

float Fp8E4m3ToFloat(uint8_t code) { return DecodeTable()[code]; }

uint8_t FloatToFp8E4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7E;
  // Round onto the grid of the binade a falls in (subnormals: spacing 2^-9). Multiplying by a
  // power of two is exact, so nearbyint sees the true tie and rounds it to even.
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a in [2^(e-1), 2^e)
  const int binade = std::max(e - 1, -6);
  const float step = std::ldexp(1.0f, binade - 3);
  a = std::nearbyint(a / step) * step;
  if (a >= kFp8E4m3Max) return sign | 0x7E;  // 448 = 1.75 * 2^8
  if (a == 0.0f) return sign;
  std::frexp(a, &e);
  if (e - 1 < -6) return sign | static_cast<uint8_t>(a / std::ldexp(1.0f, -9));
  const int mantissa = static_cast<int>(std::ldexp(a, -(e - 1) + 3)) - 8;
  return sign | static_cast<uint8_t>(((e - 1 + 7) << 3) | mantissa);
}

int64_t NumActivationScales(Fp8ActivationScheme scheme, int64_t m, int64_t k) {
  switch (scheme) {
    case Fp8ActivationScheme::kNone:
      return 0;
    case Fp8ActivationScheme::kStaticTensor:
      return 1;
    case Fp8ActivationScheme::kDynamicToken:
      return m;
    case Fp8ActivationScheme::kDynamicGroup128:
      return m * ((k + kGroup - 1) / kGroup);
  }
  return 0;
}

void QuantizeActivations(const float* x, int64_t m, int64_t k, Fp8ActivationScheme scheme,
                         float static_scale, uint8_t* codes, float* scales) {
  if (scheme == Fp8ActivationScheme::kStaticTensor) {
    scales[0] = static_scale;
    for (int64_t i = 0; i < m * k; ++i) codes[i] = QuantizeScaled(x[i], static_scale);
    return;
  }
  const int64_t width = scheme == Fp8ActivationScheme::kDynamicGroup128 ? kGroup : k;
  const int64_t groups = k == 0 ? 0 : (k + width - 1) / width;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * width, end = std::min(k, begin + width);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(x[r * k + c]));
      const float scale = ScaleFor(amax);
      scales[r * groups + g] = scale;
      for (int64_t c = begin; c < end; ++c) {
        codes[r * k + c] = QuantizeScaled(x[r * k + c], scale);
      }
    }
  }
}

void QuantizeWeight(const float* w, const Fp8ScaleGrid& grid, uint8_t* codes, float* scales) {
  const int64_t gc = grid.GridCols();
  for (int64_t br = 0; br < grid.GridRows(); ++br) {
    const int64_t r0 = br * grid.block_rows, r1 = std::min(grid.rows, r0 + grid.block_rows);
    for (int64_t bc = 0; bc < gc; ++bc) {
      const int64_t c0 = bc * grid.block_cols, c1 = std::min(grid.cols, c0 + grid.block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * grid.cols + c]));
      }
      const float scale = ScaleFor(amax);
      scales[br * gc + bc] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          codes[r * grid.cols + c] = QuantizeScaled(w[r * grid.cols + c], scale);
        }
      }
    }
  }
}

}  // namespace tandem::kernels
