// KvCacheManager under data-parallel attention (KvCacheConfig::dp_size): one pool per DP rank
// (block id x on rank x % dp_size), every block of a request from its rank's pool, room counted
// per pool, prefix hits never crossing to another rank's blocks; invariants hold throughout.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/kv_cache/kv_cache_manager.h"

namespace tandem::runtime {
namespace {

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> token(0, 50000);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = token(rng);
  return out;
}

TEST(DpPoolsTest, EachRequestTakesBlocksOfItsRanksPoolOnly) {
  auto kv = KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(kv.ok()) << kv.status();
  KvCacheManager& m = **kv;
  EXPECT_EQ(m.dp_size(), 2);
  ASSERT_TRUE(m.Allocate(1, 10, nullptr, 1));  // 3 blocks of rank 1
  ASSERT_TRUE(m.Allocate(2, 4, nullptr, 0));   // 1 block of rank 0
  for (BlockId id : m.BlockTable(1)) EXPECT_EQ(id % 2, 1) << id;
  for (BlockId id : m.BlockTable(2)) EXPECT_EQ(id % 2, 0) << id;
  EXPECT_EQ(m.NumFreeBlocksOnDpRank(0), 3);
  EXPECT_EQ(m.NumFreeBlocksOnDpRank(1), 1);
  // Rank 1 has one block left: two more fail and change nothing, although rank 0 has three.
  EXPECT_FALSE(m.Allocate(3, 8, nullptr, 1));
  EXPECT_TRUE(m.BlockTable(3).empty());
  EXPECT_EQ(m.NumFreeBlocksOnDpRank(1), 1);
  EXPECT_TRUE(m.Allocate(3, 8, nullptr, 0));
  EXPECT_FALSE(m.Allocate(4, 4, nullptr, 2));  // no DP rank 2
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
  m.Free(1);
  EXPECT_EQ(m.NumFreeBlocksOnDpRank(1), 4);
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

TEST(DpPoolsTest, PrefixHitsStayOnTheRank) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto kv = KvCacheManager::Create({.num_blocks = 16, .block_size = 4, .dp_size = 2});
  ASSERT_TRUE(kv.ok()) << kv.status();
  KvCacheManager& m = **kv;
  const std::vector<int32_t> prompt = RandomTokens(rng, 13);  // 3 full blocks + 1 token
  ASSERT_TRUE(m.Allocate(1, 13, nullptr, 0));
  m.CacheBlocks(1, prompt, "", 13);
  // Rank 1 finds nothing of rank 0's KV; rank 0 finds the three full blocks.
  EXPECT_EQ(m.FindCachedPrefix(prompt, "", false, 1).num_tokens, 0);
  PrefixMatch hit = m.FindCachedPrefix(prompt, "", false, 0);
  EXPECT_EQ(hit.num_tokens, 12);
  ASSERT_TRUE(m.Allocate(2, 13, &hit, 0));
  EXPECT_EQ(m.BlockTable(2)[0], m.BlockTable(1)[0]);
  // A match of rank 0's blocks handed to a rank 1 allocation is refused, changing nothing.
  PrefixMatch stale = m.FindCachedPrefix(prompt, "", false, 0);
  EXPECT_FALSE(m.Allocate(3, 13, &stale, 1));
  EXPECT_TRUE(m.BlockTable(3).empty());
  ASSERT_TRUE(m.Allocate(3, 13, nullptr, 1));
  m.CacheBlocks(3, prompt, "", 13);  // same hashes: rank 0's copy stays the cached one
  EXPECT_EQ(m.FindCachedPrefix(prompt, "", false, 1).num_tokens, 0);
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

TEST(DpPoolsTest, CreateRefusesBadSplits) {
  EXPECT_FALSE(KvCacheManager::Create({.num_blocks = 9, .block_size = 4, .dp_size = 2}).ok());
  EXPECT_FALSE(KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dp_size = 0}).ok());
  auto both =
      KvCacheManager::Create({.num_blocks = 8, .block_size = 4, .dcp_size = 2, .dp_size = 2});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("not be combined with dcp_size 2"), std::string::npos)
      << both.status();
}

}  // namespace
}  // namespace tandem::runtime
