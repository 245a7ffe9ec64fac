// Conversions between fp32 and the two 16-bit float formats found in checkpoints.
//
//   bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an fp32).
//   f16:  IEEE 754 binary16, 1 sign, 5 exponent (bias 15), 10 mantissa bits.
//
// Widening (16 -> 32 bits) is exact for every input: zeros, subnormals, infinities and NaNs
// (the NaN payload moves to the top of the fp32 mantissa). Narrowing (32 -> 16 bits) rounds to
// nearest, ties to even, the way PyTorch's `.to(torch.bfloat16 / torch.float16)` does: values
// past the largest finite half overflow to infinity, tiny values become subnormals or signed
// zero, and NaN stays a (quiet) NaN with its sign. All functions are pure and thread-safe.
#ifndef TANDEM_RUNTIME_MODEL_HALF_H_
#define TANDEM_RUNTIME_MODEL_HALF_H_

#include <bit>
#include <cstdint>

namespace tandem::runtime {

inline float Bf16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could clear every payload bit left and turn it into infinity, so set the
    // quiet bit.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry out of the mantissa
  // bumps the exponent, which is the correct result (up to infinity for the largest values).
  const uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (at most 10 significant bits).
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {  // infinity (mantissa 0) or NaN (payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

inline uint16_t FloatToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet so it stays a NaN
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  // 0x477ff000 = 65520, halfway between the largest f16 (65504, odd mantissa) and 65536: it and
  // everything above (infinity included) rounds to infinity.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {  // below 2^-14: f16 subnormal or zero
    // 2^-25 is exactly half the smallest subnormal and ties to even (zero).
    if (abs <= 0x33000000u) return sign;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (abs >> 23);  // in [14, 24] here
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (result & 1u) != 0)) ++result;
    // A carry into bit 10 yields 0x400, the smallest normal, which is the right encoding.
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (abs >> 13) - ((127u - 15u) << 10);
  const uint32_t remainder = abs & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u) != 0)) ++result;
  return static_cast<uint16_t>(sign | result);
}

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_HALF_H_
