#include "kernels/gemm/linear.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include "kernels/gemm/linear_kernels.h"

namespace tandem::kernels::cpu {
namespace linear_internal {
namespace {

// Cache blocking of the packed path (BLIS naming). A kKc x kNr panel of w (16 KiB) stays in L1
// while the microkernel sweeps the kMc x kKc block of a (96 KiB, L2); the kKc x kNc block of w
// (1 MiB) lives in L2/L3 and is packed once per (column block, k block).
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 96;    // multiple of kMr
constexpr int64_t kNc = 1024;  // multiple of kNr
static_assert(kMc % kMr == 0 && kNc % kNr == 0);

// 64-byte aligned scratch for packed panels.
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using AlignedBuffer = std::unique_ptr<float[], AlignedDelete>;
AlignedBuffer MakeAlignedBuffer(int64_t floats) {
  return AlignedBuffer(static_cast<float*>(
      ::operator new[](static_cast<size_t>(floats) * sizeof(float), std::align_val_t{64})));
}

// Runs fn over [0, n) in chunks aligned to `grain`, on the pool or inline.
void ParallelRange(ThreadPool* pool, int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) {
    fn(0, n);
  } else {
    pool->ParallelForGrain(n, grain, fn);
  }
}

// Packs rows [row0, row0 + rows) x columns [col0, col0 + cols) of a (leading dimension ld) into
// panels of kMr rows: dst[(r / kMr) * cols * kMr + c * kMr + r % kMr]. a and w are both
// k-contiguous, and the microkernel wants, for each k, kMr values of a (and kNr of w, packed
// by Kernels::pack_w_panel) side by side. Rows past `rows` in the last panel are zero, so the
// microkernel never needs a row guard.
void PackA(const float* src, int64_t ld, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
           float* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
    float* panel_dst = dst + r0 * cols;
    const int64_t valid = std::min(kMr, rows - r0);
    for (int64_t r = 0; r < valid; ++r) {
      const float* row = src + (row0 + r0 + r) * ld + col0;
      for (int64_t c = 0; c < cols; ++c) panel_dst[c * kMr + r] = row[c];
    }
    for (int64_t r = valid; r < kMr; ++r) {
      for (int64_t c = 0; c < cols; ++c) panel_dst[c * kMr + r] = 0.0f;
    }
  }
}

// out[i, j] = bias[j] (or 0) for the rectangle; the packed path then only accumulates.
void InitRect(const float* bias, int64_t n, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
              float* out) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = out + i * n;
    if (bias != nullptr) {
      std::memcpy(row + j0, bias + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
    } else {
      std::fill(row + j0, row + j1, 0.0f);
    }
  }
}

// out[i0:i1, j0:j1] = bias + a[i0:i1, :] w[j0:j1, :]^T, single-threaded, packed and blocked.
void PackedRect(const Kernels& kernels, const float* a, const float* w, const float* bias,
                int64_t n, int64_t k, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float* out) {
  InitRect(bias, n, i0, i1, j0, j1, out);
  const int64_t mc_max = std::min(kMc, (i1 - i0 + kMr - 1) / kMr * kMr);
  const int64_t nc_max = std::min(kNc, (j1 - j0 + kNr - 1) / kNr * kNr);
  const int64_t kc_max = std::min(kKc, k);
  AlignedBuffer a_pack = MakeAlignedBuffer(mc_max * kc_max);
  AlignedBuffer w_pack = MakeAlignedBuffer(nc_max * kc_max);
  alignas(64) float edge[kMr * kNr];

  for (int64_t jc = j0; jc < j1; jc += kNc) {
    const int64_t nc = std::min(kNc, j1 - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      for (int64_t jr = 0; jr < nc; jr += kNr) {
        kernels.pack_w_panel(w + (jc + jr) * k + pc, k, std::min(kNr, nc - jr), kc,
                             w_pack.get() + jr * kc);
      }
      for (int64_t ic = i0; ic < i1; ic += kMc) {
        const int64_t mc = std::min(kMc, i1 - ic);
        PackA(a, k, ic, mc, pc, kc, a_pack.get());
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const float* w_panel = w_pack.get() + jr * kc;
          const int64_t cols = std::min(kNr, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const float* a_panel = a_pack.get() + ir * kc;
            const int64_t rows = std::min(kMr, mc - ir);
            float* c = out + (ic + ir) * n + jc + jr;
            if (rows == kMr && cols == kNr) {
              kernels.microkernel(kc, a_panel, w_panel, c, n);
              continue;
            }
            // Ragged edge: run the full tile on scratch, add back only the valid part.
            std::fill(edge, edge + kMr * kNr, 0.0f);
            kernels.microkernel(kc, a_panel, w_panel, edge, kNr);
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t cc = 0; cc < cols; ++cc) c[r * n + cc] += edge[r * kNr + cc];
            }
          }
        }
      }
    }
  }
}

void PackedLinear(const Kernels& kernels, const float* a, const float* w, const float* bias,
                  int64_t m, int64_t n, int64_t k, float* out, ThreadPool* pool) {
  const int64_t threads = pool == nullptr ? 1 : pool->num_threads();
  // Split the columns when each thread gets a few panels of them: every thread then packs its
  // own disjoint part of w (the big operand) exactly once. Narrow outputs split the rows.
  if (threads == 1 || n >= threads * 4 * kNr || m < threads * kMr) {
    ParallelRange(pool, n, kNr, [&](int64_t j0, int64_t j1) {
      PackedRect(kernels, a, w, bias, n, k, 0, m, j0, j1, out);
    });
  } else {
    ParallelRange(pool, m, kMr, [&](int64_t i0, int64_t i1) {
      PackedRect(kernels, a, w, bias, n, k, i0, i1, 0, n, out);
    });
  }
}

// Dot-product path: w is read straight from memory, once per call, never copied; each thread
// owns a column range. For m > 2, k is cut into kDotKc blocks so that a block of 4 rows of w
// (8 KiB) stays in L1 while every row of a passes over it; with 1-2 rows of a the call is bound
// by streaming w, and whole rows stream best (measured: m = 1 ~1.6x faster unblocked).
constexpr int64_t kDotKc = 512;

void DotLinear(const Kernels& kernels, const float* a, const float* w, const float* bias, int64_t m,
               int64_t n, int64_t k, float* out, ThreadPool* pool) {
  ParallelRange(pool, n, kNr, [&](int64_t j0, int64_t j1) {
    const int64_t k_block = m <= 2 ? k : kDotKc;
    for (int64_t pc = 0; pc < k; pc += k_block) {
      const int64_t kc = std::min(k_block, k - pc);
      kernels.dot(a + pc, k, m, w + j0 * k + pc, k, j1 - j0, kc, out + j0, n, pc > 0);
    }
    if (bias == nullptr) return;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = j0; j < j1; ++j) out[i * n + j] += bias[j];
    }
  });
}

const Kernels& BestKernels() {
  // Resolved once; Avx2FmaKernels() only depends on the CPU.
  static const Kernels* const best = [] {
    const Kernels* avx2 = Avx2FmaKernels();
    return avx2 != nullptr ? avx2 : &GenericKernels();
  }();
  return *best;
}

}  // namespace

void LinearWith(const Kernels& kernels, Path path, const float* a, const float* w,
                const float* bias, int64_t m, int64_t n, int64_t k, float* out, ThreadPool* pool) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    InitRect(bias, n, 0, m, 0, n, out);
    return;
  }
  if (path == Path::kAuto) path = m <= kDotMaxRows ? Path::kDot : Path::kPacked;
  if (path == Path::kDot) {
    DotLinear(kernels, a, w, bias, m, n, k, out, pool);
  } else {
    PackedLinear(kernels, a, w, bias, m, n, k, out, pool);
  }
}

}  // namespace linear_internal

void Linear(const float* a, const float* w, const float* bias, int64_t m, int64_t n, int64_t k,
            float* out, ThreadPool* pool) {
  linear_internal::LinearWith(linear_internal::BestKernels(), linear_internal::Path::kAuto, a, w,
                              bias, m, n, k, out, pool);
}

}  // namespace tandem::kernels::cpu
