// Portable kernels in GCC vector extensions (4 x fp32 = SSE2 / NEON width). The fallback for
// CPUs without AVX2+FMA, and a second implementation the tests hold against the fp64 reference.
#include <cstring>

#include "kernels/gemm/linear_kernels.h"

namespace tandem::kernels::cpu::linear_internal {
namespace {

typedef float Vec4 __attribute__((vector_size(16)));
constexpr int64_t kLanes = 4;
constexpr int64_t kNrVecs = kNr / kLanes;

inline Vec4 Load(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, Vec4 v) { std::memcpy(p, &v, sizeof(v)); }
inline float Sum(Vec4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

void Microkernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc) {
  Vec4 acc[kMr][kNrVecs];
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNrVecs; ++v) acc[i][v] = Load(c + i * ldc + v * kLanes);
  }
  for (int64_t p = 0; p < kc; ++p) {
    Vec4 bv[kNrVecs];
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNrVecs; ++v) bv[v] = Load(b + v * kLanes);
#pragma GCC unroll 6
    for (int64_t i = 0; i < kMr; ++i) {
      const Vec4 ai = Vec4{} + a[i];  // broadcast
#pragma GCC unroll 4
      for (int64_t v = 0; v < kNrVecs; ++v) acc[i][v] += ai * bv[v];
    }
    a += kMr;
    b += kNr;
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int64_t v = 0; v < kNrVecs; ++v) Store(c + i * ldc + v * kLanes, acc[i][v]);
  }
}

void PackWPanel(const float* src, int64_t ld, int64_t rows, int64_t kc, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kc; ++c) dst[c * kNr + r] = src[r * ld + c];
  }
  for (int64_t r = rows; r < kNr; ++r) {
    for (int64_t c = 0; c < kc; ++c) dst[c * kNr + r] = 0.0f;
  }
}

// out[i * ldo + j] (+)= a_i . w_j for M rows of a and N rows of w. Each lane of each
// accumulator is an independent partial sum, reduced once at the end. M = 3, N = 4 fits the
// 16 registers of SSE2 (12 accumulators + 3 a vectors + 1 w vector).
template <int M, int N>
void DotBlock(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t k, float* out,
              int64_t ldo, bool accumulate) {
  Vec4 acc[M][N] = {};
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    Vec4 av[M];
    for (int i = 0; i < M; ++i) av[i] = Load(a + i * lda + p);
    for (int j = 0; j < N; ++j) {
      const Vec4 wv = Load(w + j * ldw + p);
      for (int i = 0; i < M; ++i) acc[i][j] += av[i] * wv;
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float s = Sum(acc[i][j]);
      for (int64_t q = p; q < k; ++q) s += a[i * lda + q] * w[j * ldw + q];
      out[i * ldo + j] = accumulate ? out[i * ldo + j] + s : s;
    }
  }
}

template <int N>
void DotRows(const float* a, int64_t lda, int64_t m, const float* w, int64_t ldw, int64_t k,
             float* out, int64_t ldo, bool accumulate) {
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) {
    DotBlock<3, N>(a + i * lda, lda, w, ldw, k, out + i * ldo, ldo, accumulate);
  }
  if (m - i == 2) DotBlock<2, N>(a + i * lda, lda, w, ldw, k, out + i * ldo, ldo, accumulate);
  if (m - i == 1) DotBlock<1, N>(a + i * lda, lda, w, ldw, k, out + i * ldo, ldo, accumulate);
}

void Dot(const float* a, int64_t lda, int64_t m, const float* w, int64_t ldw, int64_t n, int64_t k,
         float* out, int64_t ldo, bool accumulate) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) DotRows<4>(a, lda, m, w + j * ldw, ldw, k, out + j, ldo, accumulate);
  for (; j < n; ++j) DotRows<1>(a, lda, m, w + j * ldw, ldw, k, out + j, ldo, accumulate);
}

}  // namespace

const Kernels& GenericKernels() {
  static constexpr Kernels kKernels = {"generic", &Microkernel, &PackWPanel, &Dot};
  return kKernels;
}

}  // namespace tandem::kernels::cpu::linear_internal
