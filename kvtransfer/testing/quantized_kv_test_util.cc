#include "kvtransfer/testing/quantized_kv_test_util.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::kvtransfer::testing {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Hash(uint64_t seed, uint64_t block, uint64_t row, uint64_t d) {
  return Mix(Mix(Mix(seed ^ 0x5151) + block) + row * 0x10001 + d);
}

// Uniform in [0, 1) from the top 53 bits.
double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Special scale bit patterns: +inf, -inf, quiet NaN with payload, negative signalling NaN with
// payload (must not be quieted by a copy through float registers), -0, smallest denormal.
constexpr std::array<uint32_t, 6> kSpecialScales = {0x7F800000u, 0xFF800000u, 0x7FC00001u,
                                                    0xFFA5A5A5u, 0x80000000u, 0x00000001u};
// NaN, -NaN, -0, +max, -max, smallest subnormal.
constexpr std::array<uint8_t, 6> kFp8Specials = {0x7F, 0xFF, 0x80, 0x7E, 0xFE, 0x01};
// -128, 127, -1, 0.
constexpr std::array<uint8_t, 4> kInt8Specials = {0x80, 0x7F, 0xFF, 0x00};

double Fp8E4m3Magnitude(uint8_t code) {  // code in [0, 0x7E]
  const int exp = code >> 3;
  const int mant = code & 7;
  return exp == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1.0 + mant / 8.0, exp - 7);
}

const std::vector<double>& Fp8Table() {
  static const std::vector<double> table = [] {  // immutable after first use
    std::vector<double> t;
    for (int c = 0; c <= 0x7E; ++c) t.push_back(Fp8E4m3Magnitude(static_cast<uint8_t>(c)));
    return t;
  }();
  return table;
}

}  // namespace

absl::StatusOr<QuantizedKvShape> ParseQuantizedKvShape(absl::string_view quant,
                                                       absl::string_view dims) {
  QuantizedKvShape shape;
  if (quant == "fp8") {
    shape.quant = KvQuant::kFp8E4m3;
  } else if (quant == "int8") {
    shape.quant = KvQuant::kInt8;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("KV quantization '", quant, "': fp8 or int8"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(dims, ',');
  int* fields[] = {&shape.num_layers, &shape.block_size, &shape.num_kv_heads, &shape.head_dim};
  if (parts.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("KV shape '", dims, "': want L,B,H,D"));
  }
  for (size_t i = 0; i < 4; ++i) {
    if (!absl::SimpleAtoi(parts[i], fields[i]) || *fields[i] <= 0 || *fields[i] > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("KV shape '", dims, "': bad part ", i));
    }
  }
  return shape;
}

double QuantizedKvOriginal(uint64_t seed, uint64_t block, uint64_t row, int d) {
  // Rows differ in magnitude (2^-8 .. 2^8) so scales span a wide range.
  const double magnitude = std::ldexp(1.0, static_cast<int>(Hash(seed, block, row, 9999) % 17) - 8);
  return (2.0 * Unit(Hash(seed, block, row, static_cast<uint64_t>(d))) - 1.0) * magnitude;
}

std::optional<uint32_t> SpecialScaleBits(uint64_t seed, uint64_t block, uint64_t row) {
  // Rows 1 and 2 of every block: a NaN with payload and one of the list; others now and then.
  if (row == 1) return kSpecialScales[2 + block % 2];
  if (row == 2) return kSpecialScales[block % kSpecialScales.size()];
  const uint64_t h = Hash(seed, block, row, 77777);
  if (h % 29 != 0) return std::nullopt;
  return kSpecialScales[(h / 29) % kSpecialScales.size()];
}

std::optional<uint8_t> PlantedValueCode(const QuantizedKvShape& shape, uint64_t seed,
                                        uint64_t block, uint64_t row, int d) {
  const absl::Span<const uint8_t> specials = shape.quant == KvQuant::kFp8E4m3
                                                 ? absl::MakeConstSpan(kFp8Specials)
                                                 : absl::MakeConstSpan(kInt8Specials);
  if (row == 0 && d < static_cast<int>(specials.size())) return specials[d];
  const uint64_t h = Hash(seed, block, row, static_cast<uint64_t>(d) + 50000);
  if (h % 53 != 0) return std::nullopt;
  return specials[(h / 53) % specials.size()];
}

uint8_t EncodeFp8E4m3(double x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  const std::vector<double>& table = Fp8Table();
  if (a >= table.back()) return sign | 0x7E;  // saturate
  // First code with magnitude >= a; pick the nearer neighbour, ties to the even code.
  const size_t hi = std::lower_bound(table.begin(), table.end(), a) - table.begin();
  if (hi == 0) return sign;
  const size_t lo = hi - 1;
  const double dlo = a - table[lo];
  const double dhi = table[hi] - a;
  size_t code = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
  return sign | static_cast<uint8_t>(code);
}

void FillQuantizedKvBlock(const QuantizedKvShape& shape, uint64_t seed, uint64_t block,
                          absl::Span<uint8_t> values, absl::Span<uint8_t> scales) {
  const double qmax = shape.quant == KvQuant::kFp8E4m3 ? 448.0 : 127.0;
  for (uint64_t row = 0; row < shape.RowsPerBlock(); ++row) {
    double absmax = 0;
    for (int d = 0; d < shape.head_dim; ++d) {
      absmax = std::max(absmax, std::fabs(QuantizedKvOriginal(seed, block, row, d)));
    }
    const float scale = static_cast<float>(absmax / qmax);
    for (int d = 0; d < shape.head_dim; ++d) {
      const double x = QuantizedKvOriginal(seed, block, row, d) / static_cast<double>(scale);
      uint8_t code = 0;
      if (shape.quant == KvQuant::kFp8E4m3) {
        code = EncodeFp8E4m3(x);
      } else {
        code =
            static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(x), -127.0, 127.0)));
      }
      if (std::optional<uint8_t> planted = PlantedValueCode(shape, seed, block, row, d)) {
        code = *planted;
      }
      values[row * shape.head_dim + d] = code;
    }
    uint32_t bits = 0;
    std::memcpy(&bits, &scale, sizeof(bits));
    if (std::optional<uint32_t> special = SpecialScaleBits(seed, block, row)) bits = *special;
    std::memcpy(&scales[row * sizeof(float)], &bits, sizeof(bits));
  }
}

}  // namespace tandem::kvtransfer::testing
