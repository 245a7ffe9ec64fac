// ClusterMergeSplits (cluster_merge.cuh) alone: for random partials (normal rows, LSEs in
// [-8, 8]), with empty splits (-inf, o = 0), every split empty, and a NaN partial, its rows and
// LSEs are bit-identical to MergeSplitsKernel's, for 2..16 splits, 1..16 rows, head dims 64 / 128 /
// 512 (MLA's latent rows) and 128 / 256 threads a CTA.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/cluster_merge_test_kernels.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

// Partial rows of one case: which splits are empty, which row holds a NaN.
enum class Fill { kRandom, kSomeEmpty, kAllEmpty, kNan };

void CheckCase(std::mt19937& rng, int splits, int rows, int d, int threads, Fill fill) {
  SCOPED_TRACE(::testing::Message()
               << "splits " << splits << " rows " << rows << " d " << d << " threads " << threads
               << " fill " << static_cast<int>(fill));
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::uniform_real_distribution<float> lse_dist(-8.0f, 8.0f);
  std::vector<float> o(static_cast<size_t>(splits) * rows * d), l(splits * rows);
  for (float& x : o) x = val(rng);
  for (float& x : l) x = lse_dist(rng);
  for (int s = 0; s < splits; ++s) {
    for (int r = 0; r < rows; ++r) {
      const bool empty = fill == Fill::kAllEmpty || (fill == Fill::kSomeEmpty && (s + r) % 3 == 1);
      if (!empty) continue;
      l[s * rows + r] = -INFINITY;
      for (int c = 0; c < d; ++c) o[(static_cast<size_t>(s) * rows + r) * d + c] = 0.0f;
    }
  }
  if (fill == Fill::kNan) {  // a NaN in row 0's o (that column only), in the last row's LSE
    o[static_cast<size_t>(splits - 1) * rows * d + 3] = NAN;
    l[(splits - 1) * rows + rows - 1] = NAN;
  }
  DeviceBuffer<float> o_dev(o), l_dev(l);
  DeviceBuffer<__nv_bfloat16> out_a(rows * d), out_b(rows * d);
  DeviceBuffer<float> lse_a(rows), lse_b(rows);
  TANDEM_CUDA_CHECK(cudaMemset(out_a.get(), 0xff, rows * d * 2));
  TANDEM_CUDA_CHECK(cudaMemset(lse_a.get(), 0xff, rows * 4));
  TANDEM_CUDA_CHECK(cluster_merge_test::ClusterMerge(o_dev.get(), l_dev.get(), splits, rows, d,
                                                     threads, out_a.get(), lse_a.get()));
  TANDEM_CUDA_CHECK(cluster_merge_test::SeparateMerge(o_dev.get(), l_dev.get(), splits, rows, d,
                                                      out_b.get(), lse_b.get()));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<__nv_bfloat16> a = out_a.ToHost(), b = out_b.ToHost();
  const std::vector<float> la = lse_a.ToHost(), lb = lse_b.ToHost();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 2), 0);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
  if (fill == Fill::kAllEmpty) {
    EXPECT_TRUE(std::isinf(la[0]) && la[0] < 0);
  }
  if (fill == Fill::kNan) {
    EXPECT_TRUE(std::isnan(la[rows - 1]));
  }
}

TEST(ClusterMergeCudaTest, BitIdenticalToMergeSplitsKernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int d : {128, 64, 512}) {
    for (int splits = 2; splits <= 16; ++splits) {
      for (int rows : {1, 3, 4, 8, 16}) {
        for (int threads : {128, 256}) {
          CheckCase(rng, splits, rows, d, threads, Fill::kRandom);
          CheckCase(rng, splits, rows, d, threads, Fill::kSomeEmpty);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
    CheckCase(rng, 16, 4, d, 128, Fill::kAllEmpty);
    CheckCase(rng, 5, 4, d, 128, Fill::kNan);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
