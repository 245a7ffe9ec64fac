// GFLOP/s of cpu::Linear on LLM-shaped problems, on 1 and 2 threads, plus the dot vs packed
// comparison that sets linear_internal::kDotMaxRows.
//
//   bazel run //kernels/gemm:linear_bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_kernels.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

struct Shape {
  int64_t m, n, k;
};

// Best time of several repetitions (at least ~0.3 s in total, after one warm-up call).
template <typename Fn>
double BestSeconds(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30, total = 0.0;
  for (int rep = 0; rep < 50 && (rep < 3 || total < 0.3); ++rep) {
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

std::vector<float> Random(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

double Gflops(const Shape& s, double seconds) {
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) /
         seconds * 1e-9;
}

void Run() {
  std::mt19937 rng(1234);
  ThreadPool pool1(1), pool2(2);
  const linear_internal::Kernels* avx2 = linear_internal::Avx2FmaKernels();
  const linear_internal::Kernels& kernels =
      avx2 != nullptr ? *avx2 : linear_internal::GenericKernels();
  std::printf("cpu::Linear, kernels: %s (GFLOP/s, best of several runs)\n\n", kernels.name);
  std::printf("%6s %6s %6s | %10s %10s\n", "m", "n", "k", "1 thread", "2 threads");
  const Shape shapes[] = {
      {1, 4096, 4096}, {1, 11008, 4096}, {16, 4096, 4096}, {256, 2048, 2048}, {512, 4096, 4096}};
  for (const Shape& s : shapes) {
    const std::vector<float> a = Random(rng, s.m * s.k);
    const std::vector<float> w = Random(rng, s.n * s.k);
    const std::vector<float> bias = Random(rng, s.n);
    std::vector<float> out(static_cast<size_t>(s.m * s.n));
    double gflops[2];
    ThreadPool* pools[2] = {&pool1, &pool2};
    for (int t = 0; t < 2; ++t) {
      gflops[t] =
          Gflops(s, BestSeconds([&] {
                   Linear(a.data(), w.data(), bias.data(), s.m, s.n, s.k, out.data(), pools[t]);
                 }));
    }
    std::printf("%6lld %6lld %6lld | %10.1f %10.1f\n", static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), gflops[0], gflops[1]);
  }

  std::printf("\nn = k = 4096, 1 thread: dot path vs packed path (auto: dot for m <= %lld)\n\n",
              static_cast<long long>(linear_internal::kDotMaxRows));
  std::printf("%6s | %10s %10s\n", "m", "dot", "packed");
  const int64_t n = 4096, k = 4096;
  const std::vector<float> w = Random(rng, n * k);
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128}) {
    const std::vector<float> a = Random(rng, m * k);
    std::vector<float> out(static_cast<size_t>(m * n));
    double gflops[2];
    const linear_internal::Path paths[2] = {linear_internal::Path::kDot,
                                            linear_internal::Path::kPacked};
    for (int p = 0; p < 2; ++p) {
      gflops[p] = Gflops({m, n, k}, BestSeconds([&] {
                           linear_internal::LinearWith(kernels, paths[p], a.data(), w.data(),
                                                       nullptr, m, n, k, out.data(), &pool1);
                         }));
    }
    std::printf("%6lld | %10.1f %10.1f\n", static_cast<long long>(m), gflops[0], gflops[1]);
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu

int main() {
  tandem::kernels::cpu::Run();
  return 0;
}
