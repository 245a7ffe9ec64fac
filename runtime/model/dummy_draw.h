// Dummy (random) weights as a pure function of (seed, tensor, element index), usable on the host
// and in CUDA kernels: a rank of a tensor-parallel group draws exactly its slice of a tensor, on
// its own device, without drawing the rest, and gets the values the whole tensor has at those
// indices. The same seed is then the same model at any TP, on either backend (the device rounds
// the same fp32 values to bf16 / fp16), and in the files WriteDummyModel writes.
//
// Header-only and thread-safe (no state).
#ifndef TANDEM_RUNTIME_MODEL_DUMMY_DRAW_H_
#define TANDEM_RUNTIME_MODEL_DUMMY_DRAW_H_

#include <cmath>
#include <cstdint>

#include "kernels/sampling/philox.h"

namespace tandem::runtime {

// The part of a row-major checkpoint tensor [rows, cols] one rank keeps, stored densely as
// [num_rows, num_cols]: rows [row_begin, row_begin + num_rows) x columns [col_begin, col_begin +
// num_cols). A whole tensor of n elements is {cols = n, 0, 1, 0, n}; a row slice of a 1-D tensor
// (a bias) treats it as [n, 1].
struct DummySlice {
  int64_t cols = 0;  // the checkpoint tensor's columns
  int64_t row_begin = 0;
  int64_t num_rows = 0;
  int64_t col_begin = 0;
  int64_t num_cols = 0;
  TANDEM_HOST_DEVICE int64_t numel() const { return num_rows * num_cols; }
  // The checkpoint element index of local element `i` (0 <= i < numel()).
  TANDEM_HOST_DEVICE int64_t GlobalIndex(int64_t i) const {
    const int64_t r = i / num_cols;
    return (row_begin + r) * cols + col_begin + (i - r * num_cols);
  }
};

inline constexpr double kDummyStddev = 0.02;

// Elements 2p and 2p + 1 of a tensor: mean + 0.02 * (z0, z1), a Box-Muller pair from ONE
// Philox4x32-10 draw with key = seed and counter = {p low, p high, stream low, stream high}
// (u1 from words 0-1, u2 from words 2-3, 53 bits each). Computed in double, then rounded to
// float: host (glibc) and device (CUDA's libdevice, within 2 ulp of double) give the same float
// but for rare double rounding ties.
TANDEM_HOST_DEVICE inline void DummyPair(uint64_t seed, uint64_t stream_id, uint64_t pair,
                                         float mean, float* z0, float* z1) {
  const kernels::PhiloxOutput r = kernels::Philox4x32_10(
      kernels::PhiloxCounter{{static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32),
                              static_cast<uint32_t>(stream_id),
                              static_cast<uint32_t>(stream_id >> 32)}},
      kernels::PhiloxKeyFromSeed(seed));
  // u1 in (0, 1] keeps log() finite.
  const double u1 = 1.0 - kernels::UniformDouble(r.x[0], r.x[1]);
  const double u2 = kernels::UniformDouble(r.x[2], r.x[3]);
  const double radius = sqrt(-2.0 * log(u1));
  const double angle = 6.283185307179586477 * u2;
  *z0 = static_cast<float>(mean + kDummyStddev * radius * cos(angle));
  *z1 = static_cast<float>(mean + kDummyStddev * radius * sin(angle));
}

// Element `index` of the tensor drawn from `stream_id` (one half of its pair).
TANDEM_HOST_DEVICE inline float DummyValue(uint64_t seed, uint64_t stream_id, int64_t index,
                                           float mean) {
  float z0 = 0.0f, z1 = 0.0f;
  DummyPair(seed, stream_id, static_cast<uint64_t>(index) >> 1, mean, &z0, &z1);
  return (index & 1) != 0 ? z1 : z0;
}

// The stream of a checkpoint tensor: FNV-1a 64 of its transformers name (so values depend on the
// name, never on the order tensors are drawn in).
inline uint64_t DummyStreamId(const char* name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char* c = name; *c != '\0'; ++c) {
    hash ^= static_cast<uint8_t>(*c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_DUMMY_DRAW_H_
