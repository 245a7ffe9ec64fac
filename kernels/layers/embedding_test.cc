#include "kernels/layers/embedding.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kernels::cpu {
namespace {

using ::testing::HasSubstr;

std::vector<float> RandomTable(std::mt19937& rng, int64_t vocab, int64_t hidden) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> table(static_cast<size_t>(vocab * hidden));
  for (float& v : table) v = dist(rng);
  return table;
}

TEST(EmbeddingTest, GathersRows) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int64_t hidden : {1, 13, 256}) {
    const int64_t vocab = 50;
    const std::vector<float> table = RandomTable(rng, vocab, hidden);
    // Includes the first and last ids and a repeated id.
    std::vector<int32_t> ids = {0, static_cast<int32_t>(vocab - 1), 7, 7};
    for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(rng() % vocab));
    const int64_t num_tokens = static_cast<int64_t>(ids.size());
    std::vector<float> out(static_cast<size_t>(num_tokens * hidden), -1.0f);
    ASSERT_TRUE(Embedding(ids.data(), num_tokens, table.data(), vocab, hidden, out.data()).ok());
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t i = 0; i < hidden; ++i) {
        ASSERT_EQ(out[t * hidden + i], table[ids[t] * hidden + i]) << "token " << t;
      }
    }
  }
}

TEST(EmbeddingTest, ZeroTokensIsOk) {
  const std::vector<float> table = {1.0f, 2.0f};
  EXPECT_TRUE(Embedding(nullptr, 0, table.data(), 2, 1, nullptr).ok());
}

TEST(EmbeddingTest, OutOfRangeIdsAreRejectedWithoutWriting) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t vocab = 10;
  const int64_t hidden = 3;
  const std::vector<float> table = RandomTable(rng, vocab, hidden);
  struct Case {
    std::vector<int32_t> ids;
    std::string position, id;
  };
  const Case cases[] = {
      {{1, 2, -1, 3}, "position 2", "token id -1"},
      {{9, 10}, "position 1", "token id 10"},
      {{2147483647}, "position 0", "token id 2147483647"},
  };
  for (const Case& c : cases) {
    std::vector<float> out(c.ids.size() * hidden, 42.0f);
    const absl::Status s = Embedding(c.ids.data(), static_cast<int64_t>(c.ids.size()), table.data(),
                                     vocab, hidden, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.position));
    EXPECT_THAT(s.message(), HasSubstr(c.id));
    EXPECT_THAT(s.message(), HasSubstr("[0, 10)"));
    for (float v : out) ASSERT_EQ(v, 42.0f) << "out was written despite the error";
  }
}

TEST(EmbeddingTest, VocabShardsSumToTheFullLookup) {
  const int64_t vocab = 11, hidden = 3, num_tokens = 6;
  std::vector<float> table(vocab * hidden);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.5f + static_cast<float>(i) * 0.25f;
  const std::vector<int32_t> ids = {10, 0, 4, 7, 3, 10};
  std::vector<float> full(num_tokens * hidden);
  ASSERT_TRUE(Embedding(ids.data(), num_tokens, table.data(), vocab, hidden, full.data()).ok());
  for (int64_t n : {2, 3, 4}) {
    const int64_t rows = (vocab + n - 1) / n;
    std::vector<float> sum(num_tokens * hidden, 0.0f), part(num_tokens * hidden, -1.0f);
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> shard(rows * hidden, 0.0f);  // padded past the vocabulary
      for (int64_t i = 0; i < rows && r * rows + i < vocab; ++i) {
        std::copy_n(table.data() + (r * rows + i) * hidden, hidden, shard.data() + i * hidden);
      }
      ASSERT_TRUE(VocabShardEmbedding(ids.data(), num_tokens, shard.data(), r * rows, rows, vocab,
                                      hidden, part.data())
                      .ok());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_EQ(sum, full) << n << " shards";
  }
  const std::vector<int32_t> bad = {1, 11};
  EXPECT_EQ(
      VocabShardEmbedding(bad.data(), 2, table.data(), 0, 6, vocab, hidden, full.data()).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels::cpu
