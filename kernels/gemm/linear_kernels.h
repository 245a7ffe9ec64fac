// Internal to //kernels/gemm: the ISA-specific inner kernels behind Linear, and a way to pick
// them and the algorithm explicitly so tests and the benchmark can cover every combination.
#ifndef TANDEM_KERNELS_GEMM_LINEAR_KERNELS_H_
#define TANDEM_KERNELS_GEMM_LINEAR_KERNELS_H_

#include <cstdint>

#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu::linear_internal {

// Register tile of the packed microkernel: kMr rows of a by kNr rows of w (columns of out).
// 6 x 16 fills 12 of the 16 AVX2 registers with accumulators.
inline constexpr int64_t kMr = 6;
inline constexpr int64_t kNr = 16;

struct Kernels {
  const char* name;
  // c[i * ldc + j] += sum_{p < kc} a_panel[p * kMr + i] * b_panel[p * kNr + j],
  // for i < kMr, j < kNr. Panels are the packed layouts made by the driver (see linear.cc).
  void (*microkernel)(int64_t kc, const float* a_panel, const float* b_panel, float* c,
                      int64_t ldc);
  // One kNr-row panel of w for the microkernel: dst[c * kNr + r] = src[r * ld + c] for
  // r < rows (<= kNr), c < kc; rows past `rows` are zero-filled.
  void (*pack_w_panel)(const float* src, int64_t ld, int64_t rows, int64_t kc, float* dst);
  // out[i * ldo + j] (+)= sum_{p < k} a[i * lda + p] * w[j * ldw + p], for i < m, j < n;
  // overwrites, or adds when `accumulate`.
  void (*dot)(const float* a, int64_t lda, int64_t m, const float* w, int64_t ldw, int64_t n,
              int64_t k, float* out, int64_t ldo, bool accumulate);
};

// Portable GCC vector-extension kernels; always available.
const Kernels& GenericKernels();
// AVX2 + FMA kernels; null when not built for x86-64 or when this CPU lacks AVX2/FMA.
const Kernels* Avx2FmaKernels();

enum class Path {
  kAuto,    // what Linear does: kDot for m <= kDotMaxRows, else kPacked
  kDot,     // dot products straight off w
  kPacked,  // packed, register-tiled GEMM
};

// Largest m that kAuto sends down the dot-product path. Measured with linear_bench (n = k =
// 4096, one thread, AVX2): dot beats packed by 3x at m = 1 and ~1.2x at 8-16 (packing all of w
// costs more than the arithmetic saved), they are even at 32-64, packed wins from ~128 on.
inline constexpr int64_t kDotMaxRows = 16;

// Linear with an explicit kernel set and path. Same contract as Linear.
void LinearWith(const Kernels& kernels, Path path, const float* a, const float* w,
                const float* bias, int64_t m, int64_t n, int64_t k, float* out, ThreadPool* pool);

}  // namespace tandem::kernels::cpu::linear_internal

#endif  // TANDEM_KERNELS_GEMM_LINEAR_KERNELS_H_
