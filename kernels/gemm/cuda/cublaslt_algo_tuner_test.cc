// cublaslt_algo_tuner.h: which heuristic results become candidates (host only, runs without a
// GPU) and FastestCandidate's skip / none-ran / error contract with fake launches (GPU: it
// records events on a stream).
#include "kernels/gemm/cuda/cublaslt_algo_tuner.h"

#include <cstring>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"

namespace tandem::kernels::cuda {
namespace {

// Results whose algo's first word is its index, so a candidate names the result it came from.
std::vector<cublasLtMatmulHeuristicResult_t> Results(const std::vector<cublasStatus_t>& states) {
  std::vector<cublasLtMatmulHeuristicResult_t> results(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    std::memset(&results[i], 0, sizeof(results[i]));
    results[i].algo.data[0] = i;
    results[i].state = states[i];
  }
  return results;
}

TEST(CublasLtAlgoTunerTest, CandidatesAreTheUsableResultsInOrder) {
  const auto one = Results({CUBLAS_STATUS_SUCCESS});
  EXPECT_TRUE(TuneCandidates(one.data(), 1).empty());  // nothing to choose between
  EXPECT_TRUE(TuneCandidates(one.data(), 0).empty());
  const auto four = Results({CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_NOT_SUPPORTED,
                             CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_SUCCESS});
  const std::vector<cublasLtMatmulAlgo_t> got = TuneCandidates(four.data(), 4);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].data[0], 0u);
  EXPECT_EQ(got[1].data[0], 2u);
  EXPECT_EQ(got[2].data[0], 3u);
  EXPECT_EQ(TuneCandidates(four.data(), 2).size(), 1u);  // only the first `found` count
}

TEST(CublasLtAlgoTunerTest, FastestCandidateSkipsFailingLaunches) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto results =
      Results({CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_SUCCESS});
  const std::vector<cublasLtMatmulAlgo_t> candidates = TuneCandidates(results.data(), 3);
  ASSERT_EQ(candidates.size(), 3u);
  std::vector<int> launches(3, 0);
  // Only candidate 1 runs (an empty launch): it is the fastest; the others are skipped after
  // their first warm-up launch.
  absl::StatusOr<int> best = FastestCandidate(
      candidates,
      [&](const cublasLtMatmulAlgo_t& algo) {
        ++launches[algo.data[0]];
        return algo.data[0] == 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
      },
      nullptr);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 1);
  EXPECT_EQ(launches, (std::vector<int>{1, 12, 1}));  // 2 warm-up + 10 timed for the one
  best = FastestCandidate(
      candidates, [](const cublasLtMatmulAlgo_t&) { return CUBLAS_STATUS_NOT_SUPPORTED; }, nullptr);
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(*best, -1);  // none ran: the caller keeps the heuristic's first
  absl::StatusOr<bool> capturing = StreamIsCapturing(nullptr);
  ASSERT_TRUE(capturing.ok()) << capturing.status();
  EXPECT_FALSE(*capturing);
}

}  // namespace
}  // namespace tandem::kernels::cuda
