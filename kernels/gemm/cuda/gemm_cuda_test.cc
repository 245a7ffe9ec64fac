// CublasLtGemm::Linear against an fp64 reference on the same bf16/fp16-rounded inputs.
//
// Tolerance per element: |got - ref| <= rel_out * |ref| + (k + 2) * 2^-24 * scale, where
// scale = sum_k |a * w| + |bias|. The second term is the worst-case error bound of fp32
// summation in any order (gamma_k), the first the final rounding to TOut (one bf16 / fp16 ulp,
// 2^-8 / 2^-11 relative; 0 for fp32 output). A wrong layout, transpose or bias shows up as O(1)
// relative error, far outside this.
#include "kernels/gemm/cuda/gemm_cuda.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using bf16 = __nv_bfloat16;

using cuda_test::TestSeed;

struct Shape {
  int64_t m, n, k;
};

// Inputs rounded to T (as floats) and the fp64 reference without bias.
template <typename T>
struct Problem {
  Shape s;
  std::vector<float> a, w, bias;
  std::vector<double> ref;    // [m, n], no bias
  std::vector<double> scale;  // [m, n], sum |a * w|

  Problem(std::mt19937& rng, Shape shape) : s(shape) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    a.resize(s.m * s.k);
    w.resize(s.n * s.k);
    bias.resize(s.n);
    for (float& e : a) e = dist(rng);
    for (float& e : w) e = dist(rng);
    for (float& e : bias) e = 4.0f * dist(rng);
    cuda_test::RoundTo<T>(a);
    cuda_test::RoundTo<T>(w);
    cuda_test::RoundTo<T>(bias);
    ref.assign(s.m * s.n, 0.0);
    scale.assign(s.m * s.n, 0.0);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0.0, abs_acc = 0.0;
        const float* ar = &a[i * s.k];
        const float* wr = &w[j * s.k];
        for (int64_t p = 0; p < s.k; ++p) {
          const double prod = static_cast<double>(ar[p]) * wr[p];
          acc += prod;
          abs_acc += std::fabs(prod);
        }
        ref[i * s.n + j] = acc;
        scale[i * s.n + j] = abs_acc;
      }
    }
  }
};

template <typename TOut>
double RelOut() {
  if constexpr (std::is_same_v<TOut, bf16>) return 0x1p-8;
  if constexpr (std::is_same_v<TOut, __half>) return 0x1p-11;
  return 0.0;
}

template <typename T, typename TOut>
::testing::AssertionResult Check(const Problem<T>& p, bool with_bias,
                                 const std::vector<TOut>& got) {
  const Shape& s = p.s;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const double b = with_bias ? p.bias[j] : 0.0;
      const double want = p.ref[i * s.n + j] + b;
      const double tol = RelOut<TOut>() * std::fabs(want) +
                         (s.k + 2) * 0x1p-24 * (p.scale[i * s.n + j] + std::fabs(b));
      const double g = cuda_test::ToF(got[i * s.n + j]);
      if (!(std::fabs(g - want) <= tol)) {
        return ::testing::AssertionFailure()
               << "out[" << i << ", " << j << "] = " << g << ", want " << want << " (tol " << tol
               << ") for m=" << s.m << " n=" << s.n << " k=" << s.k << " bias=" << with_bias;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs all four (TOut, bias) variants of one problem. offset shifts every device pointer by
// that many elements (views at 16-byte but not 256-byte alignment).
template <typename T>
void RunProblem(CublasLtGemm& gemm, const Problem<T>& p, int64_t offset = 0) {
  const Shape& s = p.s;
  auto upload = [&](const std::vector<float>& v) {
    std::vector<T> host(offset + v.size());
    for (size_t i = 0; i < v.size(); ++i) host[offset + i] = cuda_test::FromF<T>(v[i]);
    return DeviceBuffer<T>(host);
  };
  DeviceBuffer<T> a = upload(p.a), w = upload(p.w), bias = upload(p.bias);
  DeviceBuffer<T> out_t(offset + s.m * s.n);
  DeviceBuffer<float> out_f(offset + s.m * s.n);
  for (bool with_bias : {false, true}) {
    const T* b = with_bias ? bias.get() + offset : nullptr;
    const absl::Status st_t = gemm.Linear<T, T>(a.get() + offset, w.get() + offset, b, s.m, s.n,
                                                s.k, out_t.get() + offset, nullptr);
    ASSERT_TRUE(st_t.ok()) << st_t;
    const absl::Status st_f = gemm.Linear<T, float>(a.get() + offset, w.get() + offset, b, s.m, s.n,
                                                    s.k, out_f.get() + offset, nullptr);
    ASSERT_TRUE(st_f.ok()) << st_f;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> got_t = out_t.ToHost();
    std::vector<float> got_f = out_f.ToHost();
    got_t.erase(got_t.begin(), got_t.begin() + offset);
    got_f.erase(got_f.begin(), got_f.begin() + offset);
    EXPECT_TRUE(Check(p, with_bias, got_t)) << "TOut = T";
    EXPECT_TRUE(Check(p, with_bias, got_f)) << "TOut = float";
  }
}

const Shape kShapes[] = {
    {1, 8, 8},        {1, 24, 40},     {1, 4104, 4096}, {2, 136, 72},
    {5, 1000, 264},   {17, 520, 1032}, {64, 264, 2056}, {128, 1032, 520},
    {257, 136, 4104}, {1000, 72, 200}, {2048, 24, 56},
};

TEST(GemmCudaTest, MatchesFp64ReferenceBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  auto gemm = CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    RunProblem(**gemm, Problem<bf16>(rng, s));
  }
}

TEST(GemmCudaTest, MatchesFp64ReferenceFp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  auto gemm = CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    RunProblem(**gemm, Problem<__half>(rng, s));
  }
}

// Timed algorithm choice (set_autotune_max_m): whichever candidate wins must still be correct,
// on the first (tuning) call and on later calls with the cached choice.
TEST(GemmCudaTest, AutotunedPlansMatchFp64Reference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  auto gemm = CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  (*gemm)->set_autotune_max_m(256);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const Problem<bf16> p(rng, s);
    RunProblem(**gemm, p);
    RunProblem(**gemm, p);
  }
}

TEST(GemmCudaTest, UnalignedViewsGetTheirOwnPlan) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  auto gemm = CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const Problem<bf16> p(rng, {33, 264, 520});
  RunProblem(**gemm, p);
  const size_t aligned_plans = (*gemm)->num_cached_plans();
  RunProblem(**gemm, p);  // same shapes again: cache hits only
  EXPECT_EQ((*gemm)->num_cached_plans(), aligned_plans);
  RunProblem(**gemm, p, /*offset=*/8);  // 16-byte aligned views
  EXPECT_GT((*gemm)->num_cached_plans(), aligned_plans);
}

// k (or n) not a multiple of 8 leaves rows that are not 16-byte multiples: cuBLASLt may have no
// algorithm; the contract is "correct or an error status (UNIMPLEMENTED expected)", never wrong
// numbers. The status is printed.
TEST(GemmCudaTest, OddSizesAreCorrectOrUnimplemented) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  auto gemm = CublasLtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const Shape& s : {Shape{3, 16, 13}, Shape{4, 13, 16}, Shape{7, 5, 3}}) {
    const Problem<bf16> p(rng, s);
    DeviceBuffer<bf16> a(cuda_test::Convert<bf16>(p.a)), w(cuda_test::Convert<bf16>(p.w));
    DeviceBuffer<bf16> bias(cuda_test::Convert<bf16>(p.bias));
    DeviceBuffer<float> out(s.m * s.n);
    const absl::Status st = (*gemm)->Linear<bf16, float>(a.get(), w.get(), bias.get(), s.m, s.n,
                                                         s.k, out.get(), nullptr);
    std::cout << "m=" << s.m << " n=" << s.n << " k=" << s.k << ": " << st << "\n";
    if (!st.ok()) continue;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(Check(p, true, out.ToHost()));
  }
}

// Captures Linear calls into a CUDA graph (global capture mode: any unsafe CUDA call inside
// invalidates the capture) and replays it with new inputs written into the same buffers.
// warm_first = false: the shape's first call happens inside the capture (host-side plan only).
void CaptureAndReplay(bool warm_first) {
  std::mt19937 rng(TestSeed());
  auto gemm_or = CublasLtGemm::Create();
  ASSERT_TRUE(gemm_or.ok()) << gemm_or.status();
  CublasLtGemm& gemm = **gemm_or;
  const Shape s{64, 520, 1032};
  Problem<bf16> p(rng, s);
  DeviceBuffer<bf16> a(cuda_test::Convert<bf16>(p.a)), w(cuda_test::Convert<bf16>(p.w));
  DeviceBuffer<bf16> bias(cuda_test::Convert<bf16>(p.bias));
  DeviceBuffer<bf16> out(s.m * s.n);
  DeviceBuffer<float> logits(s.m * s.n);
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto enqueue = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        (gemm.Linear<bf16, bf16>(a.get(), w.get(), bias.get(), s.m, s.n, s.k, out.get(), stream)));
    return gemm.Linear<bf16, float>(a.get(), w.get(), nullptr, s.m, s.n, s.k, logits.get(), stream);
  };
  if (warm_first) {
    ASSERT_TRUE(enqueue().ok());
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const size_t plans = gemm.num_cached_plans();
  cudaGraph_t graph;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const absl::Status st = enqueue();
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(gemm.num_cached_plans(), warm_first ? plans : plans + 2);
  cudaGraphExec_t exec;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    p = Problem<bf16>(rng, s);  // fresh inputs, same buffers
    TANDEM_CUDA_CHECK(cudaMemcpy(a.get(), cuda_test::Convert<bf16>(p.a).data(),
                                 p.a.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    TANDEM_CUDA_CHECK(cudaMemcpy(w.get(), cuda_test::Convert<bf16>(p.w).data(),
                                 p.w.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    TANDEM_CUDA_CHECK(cudaMemcpy(bias.get(), cuda_test::Convert<bf16>(p.bias).data(),
                                 p.bias.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(Check(p, true, out.ToHost())) << "replay " << replay;
    EXPECT_TRUE(Check(p, false, logits.ToHost())) << "replay " << replay;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GemmCudaTest, CapturesWarmShapesIntoCudaGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  CaptureAndReplay(/*warm_first=*/true);
}

TEST(GemmCudaTest, CapturesFirstCallOfAShapeIntoCudaGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  CaptureAndReplay(/*warm_first=*/false);
}

TEST(GemmCudaTest, RejectsBadArgumentsAndSkipsEmptyWork) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto gemm_or = CublasLtGemm::Create(0);  // no workspace is legal too
  ASSERT_TRUE(gemm_or.ok()) << gemm_or.status();
  CublasLtGemm& gemm = **gemm_or;
  DeviceBuffer<bf16> x(64);
  DeviceBuffer<float> y(64);
  const auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(code(gemm.Linear<bf16, float>(x.get(), x.get(), nullptr, -1, 8, 8, y.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(gemm.Linear<bf16, float>(x.get(), x.get(), nullptr, 1, 8, 0, y.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(gemm.Linear<bf16, float>(nullptr, x.get(), nullptr, 1, 8, 8, y.get(), nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(gemm.Linear<bf16, float>(x.get(), x.get(), nullptr, 1, 8, 8, nullptr, nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      (gemm.Linear<bf16, float>(nullptr, nullptr, nullptr, 0, 8, 8, nullptr, nullptr).ok()));
  EXPECT_TRUE((gemm.Linear<bf16, bf16>(nullptr, nullptr, nullptr, 4, 0, 8, nullptr, nullptr).ok()));
  EXPECT_EQ(gemm.num_cached_plans(), 0u);
  EXPECT_EQ(CublasLtGemm::Create(-1).status().code(), absl::StatusCode::kInvalidArgument);
  // Workspace-free instance still computes.
  std::mt19937 rng(TestSeed());
  const Problem<bf16> p(rng, {3, 24, 64});
  RunProblem(gemm, p);
}

}  // namespace
}  // namespace tandem::kernels::cuda
