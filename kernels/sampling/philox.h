// Philox4x32-10 counter-based random number generator (Salmon, Moraes, Dror, Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC 2011; the Random123 library's philox4x32 with 10
// rounds). Output is a pure function of (counter, key): no state, so any draw can be recomputed
// anywhere, on the host or in a CUDA kernel, which is what makes sampling reproducible and
// independent of how requests are batched.
//
// Header-only; every function is usable from host and device code (TANDEM_HOST_DEVICE).
#ifndef TANDEM_KERNELS_SAMPLING_PHILOX_H_
#define TANDEM_KERNELS_SAMPLING_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::kernels {

struct PhiloxCounter {
  uint32_t x[4];
};
struct PhiloxKey {
  uint32_t x[2];
};
struct PhiloxOutput {
  uint32_t x[4];
};

namespace philox_internal {

// Random123's constants: multipliers and the Weyl key schedule (golden ratio, sqrt(3) - 1).
inline constexpr uint32_t kM0 = 0xD2511F53u;
inline constexpr uint32_t kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u;
inline constexpr uint32_t kW1 = 0xBB67AE85u;

TANDEM_HOST_DEVICE constexpr void MulHiLo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

TANDEM_HOST_DEVICE constexpr PhiloxCounter Round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
  MulHiLo(kM0, c.x[0], hi0, lo0);
  MulHiLo(kM1, c.x[2], hi1, lo1);
  return PhiloxCounter{{hi1 ^ c.x[1] ^ k.x[0], lo1, hi0 ^ c.x[3] ^ k.x[1], lo0}};
}

}  // namespace philox_internal

// Philox4x32-10: 10 rounds, the key bumped by the Weyl constants between rounds.
TANDEM_HOST_DEVICE constexpr PhiloxOutput Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.x[0] += philox_internal::kW0;
      key.x[1] += philox_internal::kW1;
    }
    counter = philox_internal::Round(counter, key);
  }
  return PhiloxOutput{{counter.x[0], counter.x[1], counter.x[2], counter.x[3]}};
}

// The key of a 64-bit seed: low word first.
TANDEM_HOST_DEVICE constexpr PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return PhiloxKey{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
}

// A uniform double in [0, 1) with 53 random bits: the top 53 bits of (hi << 32 | lo), times
// 2^-53. Never returns 1.0.
TANDEM_HOST_DEVICE constexpr double UniformDouble(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// The uniform draw of a request seeded with `seed` at output index `step` on `stream`:
// Philox4x32-10 with key = seed and counter = {step low, step high, stream, 0}, the first two
// output words as 53 bits (kernels/sampling/sampling.h SamplingUniform, and its CUDA users).
TANDEM_HOST_DEVICE constexpr double SeededUniform(uint64_t seed, uint64_t step, uint32_t stream) {
  const PhiloxOutput out = Philox4x32_10(
      PhiloxCounter{{static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), stream, 0u}},
      PhiloxKeyFromSeed(seed));
  return UniformDouble(out.x[0], out.x[1]);
}

// A uniform float in [0, 1) with 24 random bits (the top 24 bits of x, times 2^-24).
TANDEM_HOST_DEVICE constexpr float UniformFloat(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_SAMPLING_PHILOX_H_
