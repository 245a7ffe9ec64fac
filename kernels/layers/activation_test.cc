#include "kernels/layers/activation.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels::cpu {
namespace {

TEST(SiluAndMulTest, MatchesFp64Reference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  struct Shape {
    int64_t num_tokens, inter;
  };
  for (const Shape s : {Shape{1, 1}, Shape{1, 11008}, Shape{3, 13}, Shape{7, 1000}, Shape{4, 37}}) {
    SCOPED_TRACE(testing::Message() << "num_tokens=" << s.num_tokens << " inter=" << s.inter);
    std::vector<float> gate_up(static_cast<size_t>(s.num_tokens * 2 * s.inter));
    for (float& v : gate_up) v = dist(rng);
    // Saturation edges: exp(-x) overflows for x < -88.7, silu(x) -> x for large x.
    const float edges[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 20.0f, -20.0f};
    for (size_t e = 0; e < std::size(edges) && e < static_cast<size_t>(s.inter); ++e) {
      gate_up[e] = edges[e];
    }
    std::vector<float> out(static_cast<size_t>(s.num_tokens * s.inter), -7.0f);
    SiluAndMul(gate_up.data(), s.num_tokens, s.inter, out.data());
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      for (int64_t i = 0; i < s.inter; ++i) {
        const double g = gate_up[t * 2 * s.inter + i];
        const double u = gate_up[t * 2 * s.inter + s.inter + i];
        const double want = g / (1.0 + std::exp(-g)) * u;
        // expf (~1 ulp) plus three rounded ops: relative error well under 1e-5. The absolute
        // floor covers silu(-100), which is -0 in fp32 and ~-4e-42 in fp64.
        ASSERT_NEAR(out[t * s.inter + i], want, 1e-5 * std::abs(want) + 1e-30)
            << "token " << t << " col " << i << " gate " << g << " up " << u;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
