// cuda::MergeAttnStates against cpu::MergeAttnStates, including empty (-inf), NaN and +inf
// partials and in-place aliasing. fp32: within 1e-6 relative; bf16/fp16: inputs rounded first,
// output within one rounding (1e-2 relative).
#include "kernels/attention/cuda/merge_attn_states_cuda.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/merge_attn_states.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

template <typename T>
void CheckMerge(std::mt19937& rng, int64_t tokens, int64_t heads, int64_t dim, bool in_place,
                double tol) {
  const int64_t rows = tokens * heads;
  std::vector<float> oa = attention_test::RandomNormal(rng, rows * dim, 1.0f);
  std::vector<float> ob = attention_test::RandomNormal(rng, rows * dim, 1.0f);
  cuda_test::RoundTo<T>(oa);
  cuda_test::RoundTo<T>(ob);
  std::vector<float> la = attention_test::RandomNormal(rng, rows, 3.0f);
  std::vector<float> lb = attention_test::RandomNormal(rng, rows, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < rows; ++r) {
    switch (r % 7) {
      case 1:
        la[r] = -inf;
        oa[r * dim] = nan;
        break;  // empty side's out is never read
      case 2:
        lb[r] = -inf;
        break;
      case 3:
        la[r] = lb[r] = -inf;
        break;
      case 4:
        lb[r] = nan;
        ob[r * dim] = nan;
        break;
      case 5:
        la[r] = inf;
        break;
      default:
        break;
    }
  }
  std::vector<float> want_o(rows * dim), want_l(rows);
  cpu::MergeAttnStates(oa.data(), la.data(), ob.data(), lb.data(), tokens, heads, dim,
                       want_o.data(), want_l.data());
  DeviceBuffer<T> oa_d(cuda_test::Convert<T>(oa)), ob_d(cuda_test::Convert<T>(ob));
  DeviceBuffer<float> la_d(la), lb_d(lb);
  DeviceBuffer<T> o_d(rows * dim);
  DeviceBuffer<float> l_d(rows);
  T* out = in_place ? oa_d.get() : o_d.get();
  float* lse = in_place ? la_d.get() : l_d.get();
  const absl::Status s = MergeAttnStates<T>(oa_d.get(), la_d.get(), ob_d.get(), lb_d.get(), tokens,
                                            heads, dim, out, lse, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_o = cuda_test::ToFloat(in_place ? oa_d.ToHost() : o_d.ToHost());
  const std::vector<float> got_l = in_place ? la_d.ToHost() : l_d.ToHost();
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isinf(want_l[r])) {
      ASSERT_EQ(got_l[r], want_l[r]) << "row " << r;
    } else {
      ASSERT_NEAR(got_l[r], want_l[r], 1e-5 * std::max(1.0f, std::abs(want_l[r]))) << "row " << r;
    }
    for (int64_t d = 0; d < dim; ++d) {
      const float w = want_o[r * dim + d], g = got_o[r * dim + d];
      ASSERT_FALSE(std::isnan(g)) << "row " << r << " dim " << d;
      ASSERT_NEAR(g, w, tol * std::max(1.0f, std::abs(w))) << "row " << r << " dim " << d;
    }
  }
}

TEST(MergeAttnStatesCudaTest, MatchesCpuWithEdgeCases) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int64_t dim : {64, 128, 256}) {
    for (bool in_place : {false, true}) {
      CheckMerge<float>(rng, 37, 8, dim, in_place, 1e-5);
      CheckMerge<__nv_bfloat16>(rng, 19, 32, dim, in_place, 1e-2);
      CheckMerge<__half>(rng, 3, 4, dim, in_place, 2e-3);
    }
  }
}

TEST(MergeAttnStatesCudaTest, RejectsBadArguments) {
  EXPECT_EQ(MergeAttnStates<float>(nullptr, nullptr, nullptr, nullptr, 1, 1, 64, nullptr, nullptr,
                                   nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeAttnStates<__nv_bfloat16>(nullptr, nullptr, nullptr, nullptr, 1, 1, 12, nullptr,
                                           nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MergeAttnStates<float>(nullptr, nullptr, nullptr, nullptr, 0, 8, 64, nullptr, nullptr,
                                     nullptr)
                  .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
