// Greedy over vocab-parallel shards (shard_argmax.h) is exactly cpu::SampleToken's greedy choice
// of the whole row: random rows with ties, NaN, +-inf, vocab_limit, 2/4/8 ranks with the last
// rank's rows padded past the vocabulary, candidates picked in any order.
#include "kernels/sampling/shard_argmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace tandem::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A row of logits drawn from few distinct values (many ties), with NaN / -inf / +inf sprinkled.
std::vector<float> RandomRow(std::mt19937& rng, int64_t vocab, int kind) {
  std::uniform_int_distribution<int> level(0, kind == 0 ? 1000000 : 6);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> row(vocab);
  for (float& x : row) {
    x = static_cast<float>(level(rng)) * 0.25f - 1.0f;
    const double r = u(rng);
    if (kind >= 2 && r < 0.2) x = std::numeric_limits<float>::quiet_NaN();
    if (kind >= 3 && r > 0.9) x = -kInf;
    if (kind == 4 && r > 0.997) x = kInf;
  }
  if (kind == 5) std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
  if (kind == 6) std::fill(row.begin(), row.end(), -kInf);
  return row;
}

TEST(ShardArgmaxTest, ShardsPickTheWholeRowsGreedyToken) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int checked = 0;
  for (int ranks : {2, 4, 8}) {
    for (int64_t vocab : {int64_t{1}, int64_t{13}, int64_t{1000}, int64_t{32003}}) {
      const int64_t rows_per_rank = (vocab + ranks - 1) / ranks;  // the last rank's are padded
      for (int kind = 0; kind <= 6; ++kind) {
        for (int64_t vocab_limit : {int64_t{0}, vocab / 3, vocab - 1, vocab + 5}) {
          std::vector<float> row = RandomRow(rng, vocab, kind);
          SamplingParams greedy;
          greedy.temperature = 0.0f;
          greedy.vocab_limit = vocab_limit;
          const int32_t want = cpu::SampleToken(row.data(), vocab, greedy, 0);
          SamplingParams top1 = greedy;  // top_k 1 with a temperature is the same choice
          top1.temperature = 0.7f;
          top1.top_k = 1;
          if (kind != 5 && kind != 6) {
            ASSERT_EQ(cpu::SampleToken(row.data(), vocab, top1, 3), want);
          }
          // Each rank's padded shard: its rows, then garbage past the vocabulary.
          const int64_t limit = ShardSampledLimit(vocab, vocab_limit);
          std::vector<ShardCandidate> candidates;
          for (int r = 0; r < ranks; ++r) {
            std::vector<float> shard(rows_per_rank, 1e30f);
            const int64_t first = r * rows_per_rank;
            for (int64_t c = 0; c < rows_per_rank && first + c < vocab; ++c) {
              shard[c] = row[first + c];
            }
            candidates.push_back(ShardArgmax(shard.data(), rows_per_rank, first, limit));
          }
          std::shuffle(candidates.begin(), candidates.end(), rng);
          ASSERT_EQ(PickShardCandidate(candidates.data(), ranks), want)
              << "ranks " << ranks << " vocab " << vocab << " kind " << kind << " limit "
              << vocab_limit;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 7 * 4);
}

TEST(ShardArgmaxTest, TiesGoToTheLowestIdAcrossRanks) {
  // Rank 1's best equals rank 0's: rank 0's (lower) id wins whatever the order.
  const ShardCandidate a{2.0f, 7}, b{2.0f, 12}, none{0.0f, -1};
  for (const auto& c : {std::vector<ShardCandidate>{a, b}, std::vector<ShardCandidate>{b, a},
                        std::vector<ShardCandidate>{none, b, a}}) {
    EXPECT_EQ(PickShardCandidate(c.data(), static_cast<int>(c.size())), 7);
  }
  EXPECT_EQ(PickShardCandidate(&none, 1), 0);  // all NaN: token 0, as the whole row
  const float nan_first[] = {std::numeric_limits<float>::quiet_NaN(), -kInf, -kInf};
  EXPECT_EQ(ShardArgmax(nan_first, 3, 40, 100).id, 41);  // -inf is a value, NaN is not
  EXPECT_EQ(ShardArgmax(nan_first, 3, 40, 41).id, -1);   // past the limit
}

}  // namespace
}  // namespace tandem::kernels
