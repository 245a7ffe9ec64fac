// AVX2 + FMA kernels (x86-64). Compiled with per-function target options rather than -mavx2 on
// the whole file, so the binary still runs on CPUs without AVX2: Avx2FmaKernels() checks the
// CPU before handing these out, and nothing here is inline-shared with other translation units.
#include "kernels/gemm/linear_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::kernels::cpu::linear_internal {

#if defined(__x86_64__)
namespace {

#pragma GCC push_options
#pragma GCC target("avx2,fma")

constexpr int64_t kLanes = 8;
static_assert(kNr == 2 * kLanes, "the microkernel holds a row of the tile in two registers");

// 6 x 16 tile: 12 accumulators + 2 w vectors + 1 broadcast of a = 15 of 16 ymm registers.
void Microkernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc) {
  __m256 acc0[kMr], acc1[kMr];
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
    acc0[i] = _mm256_loadu_ps(c + i * ldc);
    acc1[i] = _mm256_loadu_ps(c + i * ldc + kLanes);
  }
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b);  // packed panels are 32-byte aligned (kNr * 4 = 64 B)
    const __m256 b1 = _mm256_load_ps(b + kLanes);
#pragma GCC unroll 6
    for (int64_t i = 0; i < kMr; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
    }
    a += kMr;
    b += kNr;
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc0[i]);
    _mm256_storeu_ps(c + i * ldc + kLanes, acc1[i]);
  }
}

// Transposes the 8 x 8 block at src (row stride ld) into dst (row stride kNr).
inline void Transpose8x8(const float* src, int64_t ld, float* dst) {
  const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ld);
  const __m256 r2 = _mm256_loadu_ps(src + 2 * ld), r3 = _mm256_loadu_ps(src + 3 * ld);
  const __m256 r4 = _mm256_loadu_ps(src + 4 * ld), r5 = _mm256_loadu_ps(src + 5 * ld);
  const __m256 r6 = _mm256_loadu_ps(src + 6 * ld), r7 = _mm256_loadu_ps(src + 7 * ld);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst + 0 * kNr, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + 1 * kNr, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * kNr, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * kNr, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * kNr, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * kNr, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * kNr, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * kNr, _mm256_permute2f128_ps(s3, s7, 0x31));
}

// Scalar packing would spend more time than the microkernel on small-m problems; 8 x 8
// register transposes make packing w cost about a memory copy.
void PackWPanel(const float* src, int64_t ld, int64_t rows, int64_t kc, float* dst) {
  int64_t c = 0;
  if (rows == kNr) {
    for (; c + kLanes <= kc; c += kLanes) {
      Transpose8x8(src + c, ld, dst + c * kNr);
      Transpose8x8(src + kLanes * ld + c, ld, dst + c * kNr + kLanes);
    }
  }
  for (int64_t r = 0; r < kNr; ++r) {
    for (int64_t cc = c; cc < kc; ++cc) dst[cc * kNr + r] = r < rows ? src[r * ld + cc] : 0.0f;
  }
}

inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[i * ldo + j] (+)= a_i . w_j for M rows of a and N rows of w. M = 3, N = 4: 12
// accumulators + 3 a vectors + 1 w vector = 16 registers; 7 loads per 12 FMAs.
template <int M, int N>
void DotBlock(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t k, float* out,
              int64_t ldo, bool accumulate) {
  __m256 acc[M][N];
#pragma GCC unroll 12
  for (int t = 0; t < M * N; ++t) acc[t / N][t % N] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    __m256 av[M];
#pragma GCC unroll 3
    for (int i = 0; i < M; ++i) av[i] = _mm256_loadu_ps(a + i * lda + p);
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      const __m256 wv = _mm256_loadu_ps(w + j * ldw + p);
#pragma GCC unroll 3
      for (int i = 0; i < M; ++i) acc[i][j] = _mm256_fmadd_ps(av[i], wv, acc[i][j]);
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

#pragma GCC pop_options

}  // namespace

const Kernels* Avx2FmaKernels() {
  static constexpr Kernels kKernels = {"avx2_fma", &Microkernel, &PackWPanel, &Dot};
  static const bool supported = [] {
    __builtin_cpu_init();  // in case the first call comes from a static initializer
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return supported ? &kKernels : nullptr;
}

#else  // !defined(__x86_64__)

const Kernels* Avx2FmaKernels() { return nullptr; }

#endif

}  // namespace tandem::kernels::cpu::linear_internal
