// CUDA layer kernels against the CPU reference ops (kernels/layers/) run on the same
// bf16/fp16-rounded inputs. The CUDA ops round their fp32 result once to T, so outputs must be
// within one rounding of the CPU's fp32 result: 2^-8 (bf16) / 2^-11 (fp16) relative, plus a
// small absolute floor for values near 0. RoPE positions go up to 1e5.
#include "kernels/layers/cuda/layers_cuda.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/layers/activation.h"
#include "kernels/layers/embedding.h"
#include "kernels/layers/norm.h"
#include "kernels/layers/rope.h"

namespace tandem::kernels::cuda {
namespace {

using attention_test::RandomNormal;
using cuda_test::DeviceBuffer;

template <typename T>
double RelTol() {
  return std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;
}

// |got - want| <= tol * (|want| + floor) for every element, reporting the worst.
::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<float>& want,
                                    double tol, double floor) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double{got[i]} - want[i]);
    if (!(err <= tol * (std::abs(want[i]) + floor))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
void CheckNorms(std::mt19937& rng, int64_t tokens, int64_t hidden) {
  std::vector<float> x = RandomNormal(rng, tokens * hidden, 2.0f);
  std::vector<float> res = RandomNormal(rng, tokens * hidden, 2.0f);
  std::vector<float> w = RandomNormal(rng, hidden, 1.0f);
  cuda_test::RoundTo<T>(x);
  cuda_test::RoundTo<T>(res);
  cuda_test::RoundTo<T>(w);
  const float eps = 1e-5f;
  std::vector<float> want(x.size());
  cpu::RmsNorm(x.data(), w.data(), tokens, hidden, eps, want.data());
  DeviceBuffer<T> xd(cuda_test::Convert<T>(x)), wd(cuda_test::Convert<T>(w)), od(x.size());
  ASSERT_TRUE(RmsNorm<T>(xd.get(), wd.get(), tokens, hidden, eps, od.get(), nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(AllClose(cuda_test::ToFloat(od.ToHost()), want, RelTol<T>(), 1e-2)) << "RmsNorm";

  // Fused: the CPU residual sum is exact fp32; the CUDA one is rounded to T (as the next layer
  // consumes it), so compare the residual within one rounding and the output against the CPU
  // norm of the CUDA residual.
  DeviceBuffer<T> rd(cuda_test::Convert<T>(res));
  ASSERT_TRUE(FusedAddRmsNorm<T>(xd.get(), rd.get(), wd.get(), tokens, hidden, eps, nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> res_want = res;
  for (size_t i = 0; i < res.size(); ++i) res_want[i] += x[i];
  const std::vector<float> res_got = cuda_test::ToFloat(rd.ToHost());
  EXPECT_TRUE(AllClose(res_got, res_want, RelTol<T>(), 1e-2)) << "residual";
  std::vector<float> norm_want(x.size());
  cpu::RmsNorm(res_got.data(), w.data(), tokens, hidden, eps, norm_want.data());
  EXPECT_TRUE(AllClose(cuda_test::ToFloat(xd.ToHost()), norm_want, RelTol<T>(), 1e-2))
      << "fused norm";
}

TEST(LayersCudaTest, RmsNorm) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int64_t hidden : {8, 64, 1000, 4096, 5120, 8192, 20480}) {
    CheckNorms<__nv_bfloat16>(rng, 7, hidden);
    CheckNorms<__half>(rng, 3, hidden);
  }
  CheckNorms<__nv_bfloat16>(rng, 1, 8);
}

template <typename T>
void CheckRope(std::mt19937& rng, int64_t tokens, int64_t head_dim, int64_t hq, int64_t hkv,
               const RopeScaling& scaling) {
  absl::StatusOr<std::vector<float>> inv_freq = ComputeRopeInvFreq(500000.0, head_dim, scaling);
  ASSERT_TRUE(inv_freq.ok());
  std::vector<float> q = RandomNormal(rng, tokens * hq * head_dim, 1.0f);
  std::vector<float> k = RandomNormal(rng, tokens * hkv * head_dim, 1.0f);
  cuda_test::RoundTo<T>(q);
  cuda_test::RoundTo<T>(k);
  std::vector<int64_t> pos(tokens);
  std::uniform_int_distribution<int64_t> pd(0, 100000);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = t < 3 ? t : pd(rng);
  DeviceBuffer<T> qd(cuda_test::Convert<T>(q)), kd(cuda_test::Convert<T>(k));
  DeviceBuffer<int64_t> pdv(pos);
  DeviceBuffer<float> fd(*inv_freq);
  ASSERT_TRUE(
      ApplyRope<T>(pdv.get(), tokens, fd.get(), head_dim, qd.get(), hq, kd.get(), hkv, nullptr)
          .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  cpu::ApplyRope(pos.data(), tokens, inv_freq->data(), head_dim, q.data(), hq, k.data(), hkv);
  // Rotations mix two inputs: allow one output rounding relative to the row's scale.
  EXPECT_TRUE(AllClose(cuda_test::ToFloat(qd.ToHost()), q, RelTol<T>(), 0.5)) << "q";
  EXPECT_TRUE(AllClose(cuda_test::ToFloat(kd.ToHost()), k, RelTol<T>(), 0.5)) << "k";
}

TEST(LayersCudaTest, Rope) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  RopeScaling llama3{.type = RopeType::kLlama3, .factor = 8.0};
  for (int64_t d : {64, 128, 256}) {
    CheckRope<__nv_bfloat16>(rng, 33, d, 8, 2, {});
    CheckRope<__nv_bfloat16>(rng, 5, d, 32, 8, llama3);
    CheckRope<__half>(rng, 9, d, 4, 4, {});
  }
}

template <typename T>
void CheckSilu(std::mt19937& rng, int64_t tokens, int64_t inter) {
  std::vector<float> gu = RandomNormal(rng, tokens * 2 * inter, 3.0f);
  gu[0] = -200.0f;  // exp overflow -> -0
  cuda_test::RoundTo<T>(gu);
  std::vector<float> want(tokens * inter);
  cpu::SiluAndMul(gu.data(), tokens, inter, want.data());
  DeviceBuffer<T> gd(cuda_test::Convert<T>(gu)), od(want.size());
  ASSERT_TRUE(SiluAndMul<T>(gd.get(), tokens, inter, od.get(), nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(AllClose(cuda_test::ToFloat(od.ToHost()), want, RelTol<T>(), 1e-3));
}

TEST(LayersCudaTest, SiluAndMul) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int64_t inter : {8, 96, 14336}) {
    CheckSilu<__nv_bfloat16>(rng, 5, inter);
    CheckSilu<__half>(rng, 2, inter);
  }
}

TEST(LayersCudaTest, EmbeddingGatherAndBadIds) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  const int64_t vocab = 1000, hidden = 264;
  std::vector<float> table = RandomNormal(rng, vocab * hidden, 1.0f);
  cuda_test::RoundTo<__nv_bfloat16>(table);
  std::vector<int32_t> ids = {0, 999, 17, 17, 500};
  std::vector<float> want(ids.size() * hidden);
  ASSERT_TRUE(cpu::Embedding(ids.data(), 5, table.data(), vocab, hidden, want.data()).ok());
  ids.push_back(-1);
  ids.push_back(1000);
  want.resize(ids.size() * hidden, 0.0f);  // bad ids: zero rows
  DeviceBuffer<__nv_bfloat16> td(cuda_test::Convert<__nv_bfloat16>(table)), od(want.size());
  DeviceBuffer<int32_t> idd(ids), bad(std::vector<int32_t>{0});
  ASSERT_TRUE(
      Embedding<__nv_bfloat16>(idd.get(), 7, td.get(), vocab, hidden, od.get(), nullptr, bad.get())
          .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(cuda_test::ToFloat(od.ToHost()), want);
  EXPECT_EQ(bad.ToHost()[0], 2);
}

TEST(LayersCudaTest, VocabShardEmbeddingMatchesTheCpuOp) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  const int64_t vocab = 1000, hidden = 264, rows = 334, begin = 334;  // rank 1 of 3
  std::vector<float> shard = RandomNormal(rng, rows * hidden, 1.0f);
  cuda_test::RoundTo<__nv_bfloat16>(shard);
  const std::vector<int32_t> ids = {0, 999, 334, 667, 500, 333, 668};
  std::vector<float> want(ids.size() * hidden, -1.0f);
  ASSERT_TRUE(
      cpu::VocabShardEmbedding(ids.data(), 7, shard.data(), begin, rows, vocab, hidden, want.data())
          .ok());
  DeviceBuffer<__nv_bfloat16> td(cuda_test::Convert<__nv_bfloat16>(shard)), od(want.size());
  DeviceBuffer<int32_t> idd(ids);
  ASSERT_TRUE(VocabShardEmbedding<__nv_bfloat16>(idd.get(), 7, td.get(), begin, rows, hidden,
                                                 od.get(), nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(cuda_test::ToFloat(od.ToHost()), want);
}

TEST(LayersCudaTest, RejectsBadArguments) {
  EXPECT_EQ(RmsNorm<__nv_bfloat16>(nullptr, nullptr, 1, 12, 1e-5f, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SiluAndMul<__half>(nullptr, -1, 8, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ApplyRope<__nv_bfloat16>(nullptr, 1, nullptr, 24, nullptr, 1, nullptr, 1, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Embedding<__nv_bfloat16>(nullptr, 0, nullptr, 10, 8, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
