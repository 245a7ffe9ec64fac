#include "kernels/gemm/linear.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/linear_kernels.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

using linear_internal::Kernels;
using linear_internal::Path;

struct Shape {
  int64_t m, n, k;
};

// Odd sizes on purpose: ragged microkernel tiles (kMr = 6, kNr = 16), k not a multiple of the
// vector width, k > kKc (256, several k blocks; and > 512 for the dot path's k blocks),
// n > kNc (1024, several column blocks), m > kMc (96, several row blocks), narrow n with many
// rows (row split across threads), and m on both sides of kDotMaxRows (16).
constexpr Shape kShapes[] = {{1, 1, 1},      {3, 17, 33},    {64, 129, 257}, {1, 300, 70},
                             {4, 33, 1000},  {5, 20, 7},     {7, 100, 300},  {13, 37, 600},
                             {100, 1030, 9}, {200, 40, 130}, {97, 64, 256},  {2, 5, 4096},
                             {3, 7, 1537},   {17, 50, 70}};

std::vector<float> Random(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<const Kernels*> AllKernels() {
  std::vector<const Kernels*> all = {&linear_internal::GenericKernels()};
  if (const Kernels* avx2 = linear_internal::Avx2FmaKernels(); avx2 != nullptr) {
    all.push_back(avx2);
  }
  return all;
}

// Checks out against an fp64 reference. fp32 accumulation error grows like sqrt(k) * eps *
// sum_p |a_p w_p| for random data (k * eps worst case); 1e-6 * sqrt(k) is ~8 eps * sqrt(k).
// out has kGuard extra elements that must keep their sentinel value.
constexpr int64_t kGuard = 16;
constexpr float kSentinel = 12345.0f;

void ExpectMatchesReference(const std::vector<float>& a, const std::vector<float>& w,
                            const float* bias, const Shape& s, const std::vector<float>& out) {
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0;
      double abs_sum = bias != nullptr ? std::abs(bias[j]) : 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double prod = double{a[i * s.k + p]} * w[j * s.k + p];
        sum += prod;
        abs_sum += std::abs(prod);
      }
      const double tol = 1e-6 * std::sqrt(static_cast<double>(std::max<int64_t>(s.k, 1))) * abs_sum;
      ASSERT_NEAR(out[i * s.n + j], sum, tol + 1e-30) << "out[" << i << ", " << j << "]";
    }
  }
  for (int64_t g = 0; g < kGuard; ++g) ASSERT_EQ(out[s.m * s.n + g], kSentinel) << "overrun";
}

TEST(LinearTest, AllKernelsPathsAndPoolsMatchFp64) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (const Shape& s : kShapes) {
    const std::vector<float> a = Random(rng, s.m * s.k);
    const std::vector<float> w = Random(rng, s.n * s.k);
    const std::vector<float> bias = Random(rng, s.n);
    for (const Kernels* kernels : AllKernels()) {
      for (Path path : {Path::kAuto, Path::kDot, Path::kPacked}) {
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool2, &pool3}) {
          for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
            SCOPED_TRACE(testing::Message()
                         << "m=" << s.m << " n=" << s.n << " k=" << s.k
                         << " kernels=" << kernels->name << " path=" << static_cast<int>(path)
                         << " threads=" << (pool ? pool->num_threads() : 0)
                         << " bias=" << (b != nullptr));
            std::vector<float> out(static_cast<size_t>(s.m * s.n + kGuard), kSentinel);
            linear_internal::LinearWith(*kernels, path, a.data(), w.data(), b, s.m, s.n, s.k,
                                        out.data(), pool);
            ExpectMatchesReference(a, w, b, s, out);
          }
        }
      }
    }
  }
}

TEST(LinearTest, PublicEntryPointMatchesFp64) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  ThreadPool pool(2);
  for (const Shape& s : {Shape{1, 1, 1}, Shape{3, 17, 33}, Shape{64, 129, 257}, Shape{1, 512, 512},
                         Shape{16, 256, 384}}) {
    SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const std::vector<float> a = Random(rng, s.m * s.k);
    const std::vector<float> w = Random(rng, s.n * s.k);
    const std::vector<float> bias = Random(rng, s.n);
    std::vector<float> out(static_cast<size_t>(s.m * s.n + kGuard), kSentinel);
    Linear(a.data(), w.data(), bias.data(), s.m, s.n, s.k, out.data(), &pool);
    ExpectMatchesReference(a, w, bias.data(), s, out);
    // Same inputs, same pool: bitwise the same result.
    std::vector<float> again(out.size(), kSentinel);
    Linear(a.data(), w.data(), bias.data(), s.m, s.n, s.k, again.data(), &pool);
    EXPECT_EQ(out, again);
  }
}

TEST(LinearTest, EmptyShapes) {
  const std::vector<float> bias = {1.5f, -2.0f, 3.0f};
  // k == 0: out = bias (or zeros).
  std::vector<float> out(6, kSentinel);
  Linear(nullptr, nullptr, bias.data(), 2, 3, 0, out.data(), nullptr);
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 3.0f, 1.5f, -2.0f, 3.0f}));
  Linear(nullptr, nullptr, nullptr, 2, 3, 0, out.data(), nullptr);
  EXPECT_EQ(out, std::vector<float>(6, 0.0f));
  // m == 0 or n == 0: nothing is touched.
  std::vector<float> untouched(4, kSentinel);
  Linear(nullptr, nullptr, bias.data(), 0, 3, 5, untouched.data(), nullptr);
  Linear(nullptr, nullptr, nullptr, 2, 0, 5, untouched.data(), nullptr);
  EXPECT_EQ(untouched, std::vector<float>(4, kSentinel));
}

}  // namespace
}  // namespace tandem::kernels::cpu
