// SmallMLinear and SmallMLinearSiluMul against fp64 references on fresh random inputs, the fused
// SiLU*up against the unfused GEMV + SiluAndMul path (bit-identical), the norm-folded and
// residual-adding variants against RmsNorm / FusedAddRmsNorm + GEMV (bit-identical) and fp64,
// and programmatic dependent launch (eager and graph-captured chains) against ordinary launches
// (GPU; skips without one).
#include "kernels/gemm/cuda/gemv_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using bf16 = __nv_bfloat16;

using cuda_test::TestSeed;

// Unit roundoff of the output type.
template <typename TOut>
double RelOut() {
  if constexpr (std::is_same_v<TOut, float>) return 0x1p-23;
  if constexpr (std::is_same_v<TOut, bf16>) return 0x1p-8;
  return 0x1p-11;
}

// Inputs rounded to T first, so the reference sees exactly what the kernel reads.
template <typename T>
std::vector<T> RandomT(std::mt19937& rng, int64_t count, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<T> v(count);
  for (T& x : v) x = cuda_test::FromF<T>(dist(rng));
  return v;
}

// Exact dot product of row i of a [., k] and row j of w [., k] (+ bias[j]), and the sum of the
// magnitudes of its terms (for the fp32 accumulation error bound).
template <typename T>
void Dot(const std::vector<T>& a, const std::vector<T>& w, const std::vector<T>* bias, int64_t i,
         int64_t j, int64_t k, double* sum, double* mag) {
  *sum = bias != nullptr ? cuda_test::ToF((*bias)[j]) : 0.0;
  *mag = std::fabs(*sum);
  for (int64_t p = 0; p < k; ++p) {
    const double prod = double{cuda_test::ToF(a[i * k + p])} * cuda_test::ToF(w[j * k + p]);
    *sum += prod;
    *mag += std::fabs(prod);
  }
}

template <typename T, typename TOut>
void RunCase(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool with_bias, bool pdl) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " bias=" << with_bias << " pdl=" << pdl);
  const std::vector<T> a = RandomT<T>(rng, m * k), w = RandomT<T>(rng, n * k),
                       bias = RandomT<T>(rng, n);
  DeviceBuffer<T> da(a), dw(w), db(bias);
  DeviceBuffer<TOut> dout(m * n);
  // pdl on the legacy default stream too: the attribute must be accepted there.
  const absl::Status st = SmallMLinear<T, TOut>(da.get(), dw.get(), with_bias ? db.get() : nullptr,
                                                m, n, k, dout.get(), nullptr, pdl);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<TOut> got = dout.ToHost();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want, mag;
      Dot(a, w, with_bias ? &bias : nullptr, i, j, k, &want, &mag);
      const double tol = RelOut<TOut>() * std::fabs(want) + (k + 2) * 0x1p-24 * mag;
      const double g = cuda_test::ToF(got[i * n + j]);
      ASSERT_LE(std::fabs(g - want), tol)
          << "out[" << i << ", " << j << "] = " << g << ", want " << want;
    }
  }
}

TEST(GemvCudaTest, MatchesFp64Reference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t m : {1, 2, 3, 4, 5, 8}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 8},
                        {7, 72},
                        {1000, 264},
                        {333, 4096},
                        {64, 14336},
                        {4104, 1032},
                        // TP=4 Llama-3-8B's o_proj and down_proj widths: 4 and 1 + 6
                        // predicated 16-byte loads a lane (WarpDot's tail)
                        {256, 1024},
                        {96, 3584}}) {
      for (bool bias : {false, true}) {
        const bool pdl = (m + n) % 2 == 0;
        RunCase<bf16, bf16>(rng, m, n, k, bias, pdl);
        RunCase<bf16, float>(rng, m, n, k, bias, !pdl);
        RunCase<__half, __half>(rng, m, n, k, bias, pdl);
        RunCase<__half, float>(rng, m, n, k, bias, !pdl);
      }
    }
  }
}

// SmallMLinearSiluMul vs (a) SmallMLinear<T, T> into [m, 2 * inter] + SiluAndMul<T>, bit for
// bit, and (b) an fp64 reference of silu(g) * u within the error of rounding g, u and the result
// to T plus fp32 accumulation.
template <typename T>
void RunSiluMulCase(std::mt19937& rng, int64_t m, int64_t inter, int64_t k, bool with_bias,
                    bool pdl) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " inter=" << inter << " k=" << k
                                    << " bias=" << with_bias << " pdl=" << pdl);
  // Weights scaled so that g spans silu's curved region and its tails (|g| up to ~8).
  const std::vector<T> a = RandomT<T>(rng, m * k),
                       w = RandomT<T>(rng, 2 * inter * k, 2.0f / std::sqrt(float(k))),
                       bias = RandomT<T>(rng, 2 * inter);
  DeviceBuffer<T> da(a), dw(w), db(bias);
  DeviceBuffer<T> fused(m * inter), gate_up(m * 2 * inter), unfused(m * inter);
  const T* b = with_bias ? db.get() : nullptr;
  absl::Status st =
      SmallMLinearSiluMul<T>(da.get(), dw.get(), b, m, inter, k, fused.get(), nullptr, pdl);
  ASSERT_TRUE(st.ok()) << st;
  if (inter % 8 == 0) {
    st = SmallMLinear<T, T>(da.get(), dw.get(), b, m, 2 * inter, k, gate_up.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    st = SiluAndMul<T>(gate_up.get(), m, inter, unfused.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = fused.ToHost(), ref = unfused.ToHost();
  if (inter % 8 == 0) {  // SiluAndMul's 16-byte vectors need it; the fused kernel does not
    ASSERT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(T)), 0)
        << "fused differs from GEMV + SiluAndMul";
  }
  const double eps = RelOut<T>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < inter; ++j) {
      double g, g_mag, u, u_mag;
      Dot(a, w, with_bias ? &bias : nullptr, i, j, k, &g, &g_mag);
      Dot(a, w, with_bias ? &bias : nullptr, i, inter + j, k, &u, &u_mag);
      const double silu = g / (1.0 + std::exp(-g));
      const double want = silu * u;
      // Errors of g and u as the kernel rounds them; |silu'| <= 1.1 everywhere.
      const double eg = eps * std::fabs(g) + (k + 2) * 0x1p-24 * g_mag;
      const double eu = eps * std::fabs(u) + (k + 2) * 0x1p-24 * u_mag;
      const double tol =
          1.1 * eg * (std::fabs(u) + eu) + std::fabs(silu) * eu + 2 * eps * std::fabs(want) + 1e-30;
      const double v = cuda_test::ToF(got[i * inter + j]);
      ASSERT_LE(std::fabs(v - want), tol) << "out[" << i << ", " << j << "] = " << v << ", want "
                                          << want << " (g=" << g << ", u=" << u << ")";
    }
  }
}

TEST(GemvCudaTest, SiluMulMatchesUnfusedAndFp64Reference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t m = 1; m <= kGemvMaxM; ++m) {
    // Odd inter (fp64 reference only) and multiples of 8 (also bit-exact vs the unfused path).
    for (auto [inter, k] : {std::pair<int64_t, int64_t>{1, 8},
                            {7, 72},
                            {8, 264},
                            {333, 264},
                            {1000, 4096},
                            {64, 14336}}) {
      for (bool bias : {false, true}) {
        const bool pdl = (m + inter) % 2 == 1;
        RunSiluMulCase<bf16>(rng, m, inter, k, bias, pdl);
        RunSiluMulCase<__half>(rng, m, inter, k, bias, !pdl);
      }
    }
  }
}

// A chain of dependent products, each reading the previous one's output: plain linear
// [m, k] -> [m, k], then SiLU*up [m, k] -> [m, k], repeated. Launched with PDL, the next
// kernel starts before its producer finished, so a missing or misplaced grid-dependency wait
// would read stale inputs (the buffers are poisoned first). Eager PDL, graph-captured PDL
// (replayed twice) and ordinary launches must agree bit for bit.
template <typename T>
void RunPdlChain(std::mt19937& rng, int64_t m, int64_t k, int links) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " links=" << links);
  const float scale = 1.0f / std::sqrt(float(k));
  const std::vector<T> x0 = RandomT<T>(rng, m * k);
  std::vector<DeviceBuffer<T>> weights;
  for (int i = 0; i < links; ++i) {
    weights.emplace_back(RandomT<T>(rng, (i % 2 == 0 ? 1 : 2) * k * k, scale));
  }
  DeviceBuffer<T> dx0(x0), ping(m * k), pong(m * k);
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto enqueue = [&](bool pdl) -> absl::Status {
    const T* in = dx0.get();
    for (int i = 0; i < links; ++i) {
      T* out = i % 2 == 0 ? ping.get() : pong.get();
      const absl::Status st =
          i % 2 == 0
              ? SmallMLinear<T, T>(in, weights[i].get(), nullptr, m, k, k, out, stream, pdl)
              : SmallMLinearSiluMul<T>(in, weights[i].get(), nullptr, m, k, k, out, stream, pdl);
      if (!st.ok()) return st;
      in = out;
    }
    return absl::OkStatus();
  };
  auto poison_and_sync = [&] {
    ASSERT_EQ(cudaMemsetAsync(ping.get(), 0x7f, m * k * sizeof(T), stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(pong.get(), 0x7f, m * k * sizeof(T), stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  };
  auto result = [&] { return (links % 2 == 1 ? ping : pong).ToHost(); };

  poison_and_sync();
  ASSERT_TRUE(enqueue(false).ok());
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<T> want = result();
  for (const T& v : want) ASSERT_TRUE(std::isfinite(cuda_test::ToF(v)));

  poison_and_sync();
  ASSERT_TRUE(enqueue(true).ok());
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<T> got = result();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << "eager PDL";

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = enqueue(true);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(captured.ok()) << captured;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    poison_and_sync();
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    got = result();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0)
        << "graph PDL, replay " << replay;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GemvCudaTest, ProgrammaticLaunchChainsMatchOrdinaryLaunches) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  RunPdlChain<bf16>(rng, 1, 4096, 9);
  RunPdlChain<__half>(rng, 3, 1032, 8);
  RunPdlChain<bf16>(rng, 8, 264, 7);
}

// The residual add + RMSNorm folded into the GEMVs (one GPU, batch 1): SmallMLinearNormIn and
// SmallMLinearNormInSiluMul against RmsNorm<T> + the plain kernels, bit for bit, and the former
// against an fp64 reference of norm then product; SmallMLinearAddTo against SmallMLinear<T, T> +
// FusedAddRmsNorm's residual update, bit for bit, and an fp64 reference. n not a multiple of 8
// leaves idle warps in the last CTA, which must still take part in staging the norm.
template <typename T>
void RunFoldCase(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool with_bias, bool pdl) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " bias=" << with_bias << " pdl=" << pdl);
  const float eps = 1e-5f;
  const std::vector<T> x = RandomT<T>(rng, m * k, 3.0f), norm_w = RandomT<T>(rng, k),
                       w = RandomT<T>(rng, 2 * n * k, 1.0f / std::sqrt(float(k))),
                       bias = RandomT<T>(rng, 2 * n), residual = RandomT<T>(rng, m * n);
  DeviceBuffer<T> dx(x), dnw(norm_w), dw(w), db(bias), normed(m * k), fused(m * 2 * n),
      unfused(m * 2 * n), added(residual), want_added(residual), product(m * n);
  const T* b = with_bias ? db.get() : nullptr;
  // NormIn (n rows of w), NormInSiluMul (inter = n over all 2 n rows), AddTo (residual [m, n]).
  ASSERT_TRUE(SmallMLinearNormIn<T>(dx.get(), dnw.get(), eps, dw.get(), b, m, n, k, fused.get(),
                                    nullptr, pdl)
                  .ok());
  ASSERT_TRUE(SmallMLinearNormInSiluMul<T>(dx.get(), dnw.get(), eps, dw.get(), b, m, n, k,
                                           fused.get() + m * n, nullptr, !pdl)
                  .ok());
  ASSERT_TRUE(SmallMLinearAddTo<T>(dx.get(), dw.get(), b, m, n, k, added.get(), nullptr, pdl).ok());
  ASSERT_TRUE(RmsNorm<T>(dx.get(), dnw.get(), m, k, eps, normed.get(), nullptr).ok());
  ASSERT_TRUE(
      (SmallMLinear<T, T>(normed.get(), dw.get(), b, m, n, k, unfused.get(), nullptr)).ok());
  ASSERT_TRUE(
      SmallMLinearSiluMul<T>(normed.get(), dw.get(), b, m, n, k, unfused.get() + m * n, nullptr)
          .ok());
  ASSERT_TRUE((SmallMLinear<T, T>(dx.get(), dw.get(), b, m, n, k, product.get(), nullptr)).ok());
  if (n % 8 == 0) {  // FusedAddRmsNorm's 16-byte rows; its norm output lands in product
    ASSERT_TRUE(
        FusedAddRmsNorm<T>(product.get(), want_added.get(), dnw.get(), m, n, eps, nullptr).ok());
  }
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = fused.ToHost(), ref = unfused.ToHost(), got_add = added.ToHost();
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(T)), 0)
      << "norm-folded products differ from RmsNorm + GEMV";
  if (n % 8 == 0) {
    const std::vector<T> want_add = want_added.ToHost();
    EXPECT_EQ(std::memcmp(got_add.data(), want_add.data(), got_add.size() * sizeof(T)), 0)
        << "AddTo differs from GEMV + FusedAddRmsNorm's residual update";
  }
  const double u = RelOut<T>();
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t p = 0; p < k; ++p)
      ss += double{cuda_test::ToF(x[i * k + p])} * cuda_test::ToF(x[i * k + p]);
    const double inv_rms = 1.0 / std::sqrt(ss / k + eps);
    for (int64_t j = 0; j < n; ++j) {
      // Norm then product in fp64; each normalised input rounded to T (u), rsqrtf's error and
      // the fp32 sum of squares' (k 2^-25 on inv_rms), the product's fp32 accumulation.
      double want = with_bias ? cuda_test::ToF(bias[j]) : 0.0, mag = std::fabs(want);
      double dot, dot_mag;
      Dot(x, w, with_bias ? &bias : nullptr, i, j, k, &dot, &dot_mag);
      for (int64_t p = 0; p < k; ++p) {
        const double term = double{cuda_test::ToF(x[i * k + p])} * inv_rms *
                            cuda_test::ToF(norm_w[p]) * cuda_test::ToF(w[j * k + p]);
        want += term;
        mag += std::fabs(term);
      }
      const double tol =
          u * std::fabs(want) + (1.01 * u + 0x1p-21 + k * 0x1p-25 + (k + 2) * 0x1p-24) * mag;
      const double g = cuda_test::ToF(got[i * n + j]);
      ASSERT_LE(std::fabs(g - want), tol) << "normed out[" << i << ", " << j << "] = " << g;
      // residual + the product rounded to T, the sum rounded again.
      const double r = cuda_test::ToF(residual[i * n + j]);
      const double add_tol =
          u * std::fabs(r + dot) + u * std::fabs(dot) + (k + 2) * 0x1p-24 * dot_mag;
      const double a = cuda_test::ToF(got_add[i * n + j]);
      ASSERT_LE(std::fabs(a - (r + dot)), add_tol) << "residual[" << i << ", " << j << "] = " << a;
    }
  }
}

TEST(GemvCudaTest, FoldedNormAndResidualAddMatchUnfusedAndFp64Reference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  // (m + 1) * k * 2 + 32 bytes of shared memory within 48 KiB: k = 4096 up to m = 4.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 7, 72},
                         {1, 333, 4096},
                         {1, 1000, 2056},
                         {2, 64, 264},
                         {3, 13, 1032},
                         {4, 96, 4096},
                         {8, 40, 2048}}) {
    for (bool bias : {false, true}) {
      RunFoldCase<bf16>(rng, m, n, k, bias, (m + n) % 2 == 0);
      RunFoldCase<__half>(rng, m, n, k, bias, (m + n) % 2 == 1);
    }
  }
}

TEST(GemvCudaTest, RejectsUnsupportedArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> a(64), w(64);
  DeviceBuffer<bf16> out(64);
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), 0, 8, 8));
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), kGemvMaxM + 1, 1, 8));
  EXPECT_FALSE(SmallMLinearSupported(a.get(), w.get(), 1, 1, 12));     // k not a multiple of 8
  EXPECT_FALSE(SmallMLinearSupported(a.get() + 1, w.get(), 1, 1, 8));  // a not 16-byte aligned
  EXPECT_TRUE(SmallMLinearSupported(a.get(), w.get(), 2, 4, 16));
  const absl::Status st =
      SmallMLinear<bf16, bf16>(a.get(), w.get(), nullptr, 1, 1, 12, out.get(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ((SmallMLinear<bf16, bf16>(a.get(), w.get(), nullptr, 1, 1, 8, nullptr, nullptr)).code(),
            absl::StatusCode::kInvalidArgument);
  // SiLU*up: inter >= 1, the same m / k / alignment rules, non-null out.
  EXPECT_EQ(
      SmallMLinearSiluMul<bf16>(a.get(), w.get(), nullptr, 1, 0, 8, out.get(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SmallMLinearSiluMul<bf16>(a.get(), w.get(), nullptr, 9, 2, 8, out.get(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SmallMLinearSiluMul<bf16>(a.get(), w.get(), nullptr, 1, 2, 12, out.get(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SmallMLinearSiluMul<bf16>(a.get() + 1, w.get(), nullptr, 1, 2, 8, out.get(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SmallMLinearSiluMul<bf16>(a.get(), w.get(), nullptr, 1, 2, 8, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Norm folded in: a norm weight, and (m + 1) * k * 2 + 32 bytes of shared memory within
  // 48 KiB (m = 5 at k = 4096 is 32 bytes over: its launch failed).
  EXPECT_TRUE(SmallMLinearNormInSupported(a.get(), w.get(), w.get(), 1, 4, 16));
  EXPECT_FALSE(SmallMLinearNormInSupported(a.get(), nullptr, w.get(), 1, 4, 16));
  EXPECT_TRUE(SmallMLinearNormInSupported(a.get(), w.get(), w.get(), 4, 4, 4096));
  EXPECT_FALSE(SmallMLinearNormInSupported(a.get(), w.get(), w.get(), 5, 4, 4096));
  EXPECT_EQ(SmallMLinearNormIn<bf16>(a.get(), nullptr, 1e-5f, w.get(), nullptr, 1, 4, 16, out.get(),
                                     nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SmallMLinearNormInSiluMul<bf16>(a.get(), w.get(), 1e-5f, w.get(), nullptr, 1, 0, 16,
                                            out.get(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SmallMLinearAddTo<bf16>(a.get(), w.get(), nullptr, 1, 4, 16, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels::cuda
