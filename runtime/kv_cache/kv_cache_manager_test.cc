#include "runtime/kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

MATCHER(IsOk, "") { return arg.ok(); }

std::vector<BlockId> Table(const KvCacheManager& kv, int64_t request_id) {
  const absl::Span<const BlockId> table = kv.BlockTable(request_id);
  return std::vector<BlockId>(table.begin(), table.end());
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  KvCacheManagerTest() : seed_(std::random_device{}()), rng_(seed_) {
    std::printf("seed %u\n", seed_);  // every test's log
  }

  std::unique_ptr<KvCacheManager> Make(int64_t num_blocks, int64_t block_size = 4,
                                       bool prefix_caching = true) {
    auto kv = KvCacheManager::Create({.num_blocks = num_blocks,
                                      .block_size = block_size,
                                      .enable_prefix_caching = prefix_caching});
    EXPECT_TRUE(kv.ok()) << kv.status();
    return std::move(kv).value();
  }

  std::vector<int32_t> RandomTokens(size_t n) {
    std::uniform_int_distribution<int32_t> dist(0, 150000);  // vocabulary-sized ids
    std::vector<int32_t> tokens(n);
    for (int32_t& token : tokens) token = dist(rng_);
    return tokens;
  }

  // Allocates and caches a whole token sequence for a new request (as if fully computed).
  void Compute(KvCacheManager& kv, int64_t id, const std::vector<int32_t>& tokens,
               const std::string& salt = "") {
    ASSERT_TRUE(kv.Allocate(id, tokens.size(), nullptr));
    kv.CacheBlocks(id, tokens, salt, tokens.size());
    ASSERT_THAT(kv.CheckInvariants(), IsOk()) << kv.CheckInvariants();
  }

  const uint32_t seed_;
  std::mt19937 rng_;
};

TEST_F(KvCacheManagerTest, CreateValidatesConfig) {
  EXPECT_EQ(KvCacheManager::Create({.num_blocks = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create({.num_blocks = -3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create({.num_blocks = int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto bad_block = KvCacheManager::Create({.num_blocks = 4, .block_size = 0});
  EXPECT_EQ(bad_block.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_block.status().message().find("block_size"), absl::string_view::npos);
  auto kv = Make(7, 16);
  EXPECT_EQ(kv->num_blocks(), 7);
  EXPECT_EQ(kv->block_size(), 16);
  EXPECT_EQ(kv->NumFreeBlocks(), 7);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, NumBlocksForBudget) {
  EXPECT_EQ(NumBlocksForBudget(100, 10).value(), 10);
  EXPECT_EQ(NumBlocksForBudget(109, 10).value(), 10);
  EXPECT_EQ(NumBlocksForBudget(10, 10).value(), 1);
  EXPECT_EQ(NumBlocksForBudget(9, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBlocksForBudget(0, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBlocksForBudget(-1, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBlocksForBudget(100, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBlocksForBudget(100, -5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvCacheManagerTest, AllocationGrowsTablesAcrossCalls) {
  auto kv = Make(8, 4);
  EXPECT_EQ(kv->NumBlocksNeeded(1, 1, nullptr), 1);
  ASSERT_TRUE(kv->Allocate(1, 1, nullptr));
  EXPECT_EQ(Table(*kv, 1), (std::vector<BlockId>{0}));  // fresh pool: id order
  EXPECT_EQ(kv->NumBlocksNeeded(1, 4, nullptr), 0);
  ASSERT_TRUE(kv->Allocate(1, 4, nullptr));
  EXPECT_EQ(Table(*kv, 1).size(), 1u);
  ASSERT_TRUE(kv->Allocate(2, 6, nullptr));  // interleaved request
  EXPECT_EQ(Table(*kv, 2), (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(kv->NumBlocksNeeded(1, 13, nullptr), 3);
  ASSERT_TRUE(kv->Allocate(1, 13, nullptr));
  EXPECT_EQ(Table(*kv, 1), (std::vector<BlockId>{0, 3, 4, 5}));  // append-only
  ASSERT_TRUE(kv->Allocate(1, 2, nullptr));                      // never shrinks
  EXPECT_EQ(Table(*kv, 1).size(), 4u);
  EXPECT_EQ(kv->NumFreeBlocks(), 2);
  EXPECT_NEAR(kv->Stats().Usage(), 6.0 / 8.0, 1e-12);
  // Nothing requested: no entry, no blocks.
  ASSERT_TRUE(kv->Allocate(3, 0, nullptr));
  ASSERT_TRUE(kv->Allocate(3, -5, nullptr));
  EXPECT_TRUE(kv->BlockTable(3).empty());
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
  kv->Free(1);
  kv->Free(2);
  kv->Free(3);  // unknown: no-op
  kv->Free(99);
  EXPECT_EQ(kv->NumFreeBlocks(), 8);
  EXPECT_TRUE(kv->BlockTable(1).empty());
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, FailedAllocationChangesNothing) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(6, 4);
  // A cached, freed 2-block chain (free but valuable) and a running request with 3 blocks.
  const std::vector<int32_t> cached = RandomTokens(8);
  Compute(*kv, 1, cached);
  kv->Free(1);
  ASSERT_TRUE(kv->Allocate(2, 12, nullptr));  // takes the 3 never-used blocks first
  const std::vector<BlockId> table2 = Table(*kv, 2);
  const PrefixMatch hit = kv->FindCachedPrefix(Concat(cached, {5}), "", false);
  ASSERT_EQ(hit.blocks.size(), 2u);
  const KvCacheStats before = kv->Stats();
  ASSERT_EQ(before.num_free_blocks, 3);
  ASSERT_EQ(before.num_cached_blocks, 2);

  // New request: 2 revived + 2 new > 3 free.
  EXPECT_EQ(kv->NumBlocksNeeded(3, 16, &hit), 4);
  EXPECT_FALSE(kv->Allocate(3, 16, &hit));
  // Without the prefix: 4 new > 3 free.
  EXPECT_FALSE(kv->Allocate(4, 13, nullptr));
  // Growing a running request beyond the pool.
  EXPECT_EQ(kv->NumBlocksNeeded(2, 28, nullptr), 4);
  EXPECT_FALSE(kv->Allocate(2, 28, nullptr));

  const KvCacheStats after = kv->Stats();
  EXPECT_EQ(after.num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(after.num_cached_blocks, before.num_cached_blocks);
  EXPECT_TRUE(kv->BlockTable(3).empty());
  EXPECT_TRUE(kv->BlockTable(4).empty());
  EXPECT_EQ(Table(*kv, 2), table2);
  EXPECT_EQ(kv->FindCachedPrefix(Concat(cached, {5}), "", false).blocks, hit.blocks);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
  // The exact fit succeeds: 2 revived + 1 new = 3 free.
  EXPECT_EQ(kv->NumBlocksNeeded(3, 12, &hit), 3);
  EXPECT_TRUE(kv->Allocate(3, 12, &hit));
  EXPECT_EQ(kv->NumFreeBlocks(), 0);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, CommonPrefixSharesPhysicalBlocks) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(16, 4);
  const std::vector<int32_t> system_prompt = RandomTokens(12);
  const std::vector<int32_t> a = Concat(system_prompt, RandomTokens(2));
  const std::vector<int32_t> b = Concat(system_prompt, RandomTokens(1));
  Compute(*kv, 1, a);
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);  // the partial 4th block is not cached

  const PrefixMatch hit = kv->FindCachedPrefix(b, "", true);
  ASSERT_EQ(hit.num_tokens, 12);
  const std::vector<BlockId> table_a = Table(*kv, 1);
  EXPECT_EQ(hit.blocks, std::vector<BlockId>(table_a.begin(), table_a.begin() + 3));
  EXPECT_EQ(kv->NumBlocksNeeded(2, b.size(), &hit), 1);  // shared blocks are in use: free
  ASSERT_TRUE(kv->Allocate(2, b.size(), &hit));
  const std::vector<BlockId> table_b = Table(*kv, 2);
  ASSERT_EQ(table_b.size(), 4u);
  EXPECT_EQ(std::vector<BlockId>(table_b.begin(), table_b.begin() + 3), hit.blocks);
  EXPECT_NE(table_b[3], table_a[3]);
  EXPECT_EQ(kv->NumFreeBlocks(), 16 - 5);
  kv->CacheBlocks(2, b, "", b.size());  // nothing new is full
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());

  // Ref count 2: freeing one owner releases only its private block.
  kv->Free(1);
  EXPECT_EQ(kv->NumFreeBlocks(), 16 - 4);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
  kv->Free(2);
  EXPECT_EQ(kv->NumFreeBlocks(), 16);
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);  // still reusable
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, MatchLeavesAtLeastOneToken) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(8, 4);
  const std::vector<int32_t> tokens = RandomTokens(9);
  Compute(*kv, 1, tokens);
  ASSERT_EQ(kv->Stats().num_cached_blocks, 2);
  const std::vector<int32_t> exact(tokens.begin(), tokens.begin() + 8);
  EXPECT_EQ(kv->FindCachedPrefix(exact, "", false).num_tokens, 4);  // (8 - 1) / 4 = 1 block
  EXPECT_EQ(kv->FindCachedPrefix(tokens, "", false).num_tokens, 8);
  EXPECT_EQ(
      kv->FindCachedPrefix(std::vector<int32_t>(tokens.begin(), tokens.begin() + 4), "", false)
          .num_tokens,
      0);
  EXPECT_EQ(kv->FindCachedPrefix({}, "", false).num_tokens, 0);
  EXPECT_EQ(kv->FindCachedPrefix(std::vector<int32_t>{tokens[0]}, "", false).num_tokens, 0);
}

TEST_F(KvCacheManagerTest, SaltIsolatesTenants) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(8, 4);
  const std::vector<int32_t> tokens = RandomTokens(13);
  Compute(*kv, 1, tokens, "tenant-a");
  EXPECT_EQ(kv->FindCachedPrefix(tokens, "tenant-a", false).num_tokens, 12);
  EXPECT_EQ(kv->FindCachedPrefix(tokens, "tenant-b", false).num_tokens, 0);
  EXPECT_EQ(kv->FindCachedPrefix(tokens, "", false).num_tokens, 0);
}

TEST_F(KvCacheManagerTest, EvictsTailOfChainFirst) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(3, 4);
  const std::vector<int32_t> chain = RandomTokens(12);
  Compute(*kv, 1, chain);
  const std::vector<BlockId> table = Table(*kv, 1);
  kv->Free(1);
  EXPECT_EQ(kv->NumFreeBlocks(), 3);
  ASSERT_TRUE(kv->Allocate(2, 1, nullptr));
  EXPECT_EQ(Table(*kv, 2), (std::vector<BlockId>{table[2]}));  // the chain's LAST block
  EXPECT_EQ(kv->Stats().num_cached_blocks, 2);
  const PrefixMatch hit = kv->FindCachedPrefix(Concat(chain, {1}), "", false);
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{table[0], table[1]}));
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, EvictsLeastRecentlyFreedFirst) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(6, 4);
  const std::vector<int32_t> a = RandomTokens(8), b = RandomTokens(8), c = RandomTokens(8);
  Compute(*kv, 1, a);
  Compute(*kv, 2, b);
  Compute(*kv, 3, c);
  kv->Free(1);  // oldest
  kv->Free(2);
  kv->Free(3);
  // Queue (head first): a1 a0 b1 b0 c1 c0.
  auto hits = [&](const std::vector<int32_t>& tokens) {
    return kv->FindCachedPrefix(Concat(tokens, {1}), "", false).blocks.size();
  };
  // A hit on b revives it; freed again, it becomes the most recently freed chain.
  const PrefixMatch hit_b = kv->FindCachedPrefix(Concat(b, {1}), "", false);
  ASSERT_EQ(hit_b.blocks.size(), 2u);
  ASSERT_TRUE(kv->Allocate(4, 9, &hit_b));  // b0 b1 + one new block: evicts a1 (the head)
  EXPECT_EQ(hits(a), 1u);
  kv->Free(4);  // queue: a0 c1 c0 x b1 b0 (x = request 4's uncached third block)
  ASSERT_TRUE(kv->Allocate(5, 4, nullptr));  // evicts a0
  EXPECT_EQ(hits(a), 0u);
  EXPECT_EQ(hits(c), 2u);
  ASSERT_TRUE(kv->Allocate(6, 4, nullptr));  // evicts c1: a chain's tail goes first
  EXPECT_EQ(hits(c), 1u);
  ASSERT_TRUE(kv->Allocate(7, 8, nullptr));  // c0 and x
  EXPECT_EQ(hits(c), 0u);
  EXPECT_EQ(hits(b), 2u);
  ASSERT_TRUE(kv->Allocate(8, 4, nullptr));  // only now does b lose its tail
  EXPECT_EQ(hits(b), 1u);
  EXPECT_EQ(kv->NumFreeBlocks(), 1);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, FreedCachedBlockIsRevivedOnHit) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(8, 4);
  const std::vector<int32_t> prompt = RandomTokens(13);
  Compute(*kv, 1, prompt);
  const std::vector<BlockId> old_table = Table(*kv, 1);
  kv->Free(1);
  EXPECT_EQ(kv->NumFreeBlocks(), 8);
  const PrefixMatch hit = kv->FindCachedPrefix(prompt, "", true);
  ASSERT_EQ(hit.blocks.size(), 3u);
  EXPECT_EQ(kv->NumFreeBlocks(), 8);  // lookups take no references
  EXPECT_EQ(kv->NumBlocksNeeded(2, 13, &hit), 1 + 3);
  ASSERT_TRUE(kv->Allocate(2, 13, &hit));
  const std::vector<BlockId> table = Table(*kv, 2);
  EXPECT_EQ(std::vector<BlockId>(table.begin(), table.begin() + 3),
            std::vector<BlockId>(old_table.begin(), old_table.begin() + 3));
  EXPECT_EQ(kv->NumFreeBlocks(), 4);
  // prefix is used only on the first allocation.
  ASSERT_TRUE(kv->Allocate(2, 14, &hit));
  EXPECT_EQ(kv->BlockTable(2).size(), 4u);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, StalePrefixIsRejected) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(2, 4);
  const std::vector<int32_t> prompt = RandomTokens(8);
  Compute(*kv, 1, prompt);
  kv->Free(1);
  const PrefixMatch hit = kv->FindCachedPrefix(Concat(prompt, {3}), "", false);
  ASSERT_EQ(hit.blocks.size(), 2u);
  ASSERT_TRUE(kv->Allocate(2, 8, nullptr));  // evicts both cached blocks
  kv->Free(2);
  EXPECT_FALSE(kv->Allocate(3, 9, &hit));
  EXPECT_TRUE(kv->BlockTable(3).empty());
  EXPECT_EQ(kv->NumFreeBlocks(), 2);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, StatsHitRate) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(16, 4);
  EXPECT_EQ(kv->Stats().HitRate(), 0.0);
  const std::vector<int32_t> prompt = RandomTokens(16);
  EXPECT_EQ(kv->FindCachedPrefix(prompt, "", true).num_tokens, 0);  // cold: 0 / 16
  Compute(*kv, 1, prompt);
  EXPECT_EQ(kv->FindCachedPrefix(prompt, "", true).num_tokens, 12);   // 12 / 16
  EXPECT_EQ(kv->FindCachedPrefix(prompt, "", false).num_tokens, 12);  // not recorded
  const KvCacheStats stats = kv->Stats();
  EXPECT_EQ(stats.prefix_queried_tokens, 32);
  EXPECT_EQ(stats.prefix_hit_tokens, 12);
  EXPECT_DOUBLE_EQ(stats.HitRate(), 12.0 / 32.0);
  EXPECT_EQ(stats.num_cached_blocks, 4);
  EXPECT_EQ(stats.num_blocks, 16);
  EXPECT_EQ(stats.num_free_blocks, 12);
  EXPECT_DOUBLE_EQ(stats.Usage(), 4.0 / 16.0);
}

TEST_F(KvCacheManagerTest, DuplicateBlocksStayUncachedButChainContinues) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(16, 4);
  // Two requests computed the same prompt concurrently (both missed the cache).
  const std::vector<int32_t> prompt = RandomTokens(9);
  ASSERT_TRUE(kv->Allocate(1, 9, nullptr));
  ASSERT_TRUE(kv->Allocate(2, 9, nullptr));
  kv->CacheBlocks(1, prompt, "", 9);
  kv->CacheBlocks(2, prompt, "", 9);
  kv->CacheBlocks(2, prompt, "", 9);            // idempotent
  EXPECT_EQ(kv->Stats().num_cached_blocks, 2);  // request 1's copies won
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
  // Request 2 decodes on: its third block fills and is cached, chained from its duplicates.
  std::vector<int32_t> tokens = Concat(prompt, RandomTokens(4));
  ASSERT_TRUE(kv->Allocate(2, 13, nullptr));
  kv->CacheBlocks(2, tokens, "", 12);  // block 3 (tokens 8..11) is now full
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);
  const PrefixMatch hit = kv->FindCachedPrefix(tokens, "", false);
  const std::vector<BlockId> table1 = Table(*kv, 1), table2 = Table(*kv, 2);
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{table1[0], table1[1], table2[2]}));
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, CacheBlocksIsIncrementalAndClamped) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(16, 4);
  std::vector<int32_t> tokens = RandomTokens(3);
  ASSERT_TRUE(kv->Allocate(1, 3, nullptr));
  kv->CacheBlocks(1, tokens, "", 3);
  EXPECT_EQ(kv->Stats().num_cached_blocks, 0);
  for (int step = 0; step < 10; ++step) {  // decode one token per step
    tokens.push_back(static_cast<int32_t>(rng_() % 1000));
    ASSERT_TRUE(kv->Allocate(1, tokens.size(), nullptr));
    kv->CacheBlocks(1, tokens, "", tokens.size());
    EXPECT_EQ(kv->Stats().num_cached_blocks, static_cast<int64_t>(tokens.size() / 4));
  }
  // Clamped: num_tokens past tokens.size() or past the table registers nothing extra.
  kv->CacheBlocks(1, tokens, "", 1000);
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);
  kv->CacheBlocks(77, tokens, "", 13);  // unknown request
  EXPECT_EQ(kv->Stats().num_cached_blocks, 3);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

TEST_F(KvCacheManagerTest, PrefixCachingDisabled) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  auto kv = Make(8, 4, /*prefix_caching=*/false);
  const std::vector<int32_t> prompt = RandomTokens(13);
  Compute(*kv, 1, prompt);
  EXPECT_EQ(kv->Stats().num_cached_blocks, 0);
  const PrefixMatch hit = kv->FindCachedPrefix(prompt, "", true);
  EXPECT_TRUE(hit.blocks.empty());
  EXPECT_EQ(hit.num_tokens, 0);
  EXPECT_EQ(kv->Stats().prefix_queried_tokens, 0);
  kv->Free(1);
  EXPECT_EQ(kv->NumFreeBlocks(), 8);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

// Randomized model check. The test plays the KV memory itself: whenever a request "computes"
// tokens, it writes them (with their logical position and salt) into a simulated copy of each
// physical block. Every prefix hit must then point at blocks whose simulated content equals the
// looked-up tokens, which catches any stale hash surviving a block's reuse. CheckInvariants runs
// after every operation; a failed Allocate must leave the observable state unchanged.
class KvCacheStressTest : public KvCacheManagerTest,
                          public ::testing::WithParamInterface<int64_t> {};

TEST_P(KvCacheStressTest, RandomOperationsKeepInvariants) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const int64_t block_size = GetParam();
  const int64_t num_blocks = 8 + rng_() % 40;  // small enough to run out
  SCOPED_TRACE(testing::Message() << "block_size " << block_size << " num_blocks " << num_blocks);
  auto kv = Make(num_blocks, block_size);

  // Shared prefixes ("system prompts") so requests actually share blocks.
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 4; ++f) families.push_back(RandomTokens(block_size * (rng_() % 7)));
  const std::vector<std::string> salts = {"", "tenant-1", "tenant-2"};

  struct SimRequest {
    std::vector<int32_t> tokens;
    std::string salt;
    int64_t computed = 0;
  };
  absl::flat_hash_map<int64_t, SimRequest> running;
  struct SimBlock {
    std::vector<int32_t> tokens;
    int64_t position = -1;
    std::string salt;
  };
  std::vector<SimBlock> memory(num_blocks, SimBlock{std::vector<int32_t>(block_size, -1), -1, ""});
  int64_t next_id = 0, num_hit_blocks = 0, num_failed = 0;

  auto check_hit = [&](const PrefixMatch& hit, const std::vector<int32_t>& tokens,
                       const std::string& salt) {
    ASSERT_EQ(hit.num_tokens, static_cast<int64_t>(hit.blocks.size()) * block_size);
    ASSERT_LE(hit.num_tokens, std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - 1));
    for (size_t i = 0; i < hit.blocks.size(); ++i) {
      const SimBlock& block = memory[hit.blocks[i]];
      ASSERT_EQ(block.position, static_cast<int64_t>(i));
      ASSERT_EQ(block.salt, salt);
      ASSERT_TRUE(
          std::equal(block.tokens.begin(), block.tokens.end(), tokens.begin() + i * block_size))
          << "block " << hit.blocks[i] << " holds other tokens";
    }
    num_hit_blocks += hit.blocks.size();
  };
  // "Runs the model" on tokens [from, to) of a request: writes their KV into its blocks.
  auto compute = [&](int64_t id, SimRequest& request, int64_t to) {
    const absl::Span<const BlockId> table = kv->BlockTable(id);
    for (int64_t p = request.computed; p < to; ++p) {
      SimBlock& block = memory[table[p / block_size]];
      block.tokens[p % block_size] = request.tokens[p];
      block.position = p / block_size;
      block.salt = request.salt;
    }
    request.computed = to;
    kv->CacheBlocks(id, request.tokens, request.salt, to);
  };
  struct Snapshot {
    int64_t free, cached, queried, hit;
    absl::flat_hash_map<int64_t, std::vector<BlockId>> tables;
    bool operator==(const Snapshot&) const = default;
  };
  auto snapshot = [&] {
    const KvCacheStats stats = kv->Stats();
    Snapshot snap{stats.num_free_blocks,
                  stats.num_cached_blocks,
                  stats.prefix_queried_tokens,
                  stats.prefix_hit_tokens,
                  {}};
    for (const auto& [id, request] : running) snap.tables[id] = Table(*kv, id);
    return snap;
  };
  auto try_allocate = [&](int64_t id, int64_t num_tokens, const PrefixMatch* prefix) {
    const int64_t needed = kv->NumBlocksNeeded(id, num_tokens, prefix);
    const Snapshot before = snapshot();
    const bool ok = kv->Allocate(id, num_tokens, prefix);
    EXPECT_EQ(ok, needed <= before.free) << "needed " << needed << " free " << before.free;
    if (!ok) {
      EXPECT_TRUE(snapshot() == before) << "failed Allocate changed state";
      ++num_failed;
    } else {
      EXPECT_EQ(kv->NumFreeBlocks(), before.free - needed);
      EXPECT_EQ(static_cast<int64_t>(kv->BlockTable(id).size()),
                std::max<int64_t>(before.tables.contains(id) ? before.tables.at(id).size() : 0,
                                  (num_tokens + block_size - 1) / block_size));
    }
    return ok;
  };
  auto random_running = [&]() -> int64_t {
    auto it = running.begin();
    std::advance(it, rng_() % running.size());
    return it->first;
  };

  for (int op = 0; op < 3000; ++op) {
    SCOPED_TRACE(testing::Message() << "op " << op);
    const int kind = rng_() % 10;
    if (kind < 3 && running.size() < 24) {  // admit a new request (prefill, maybe chunked)
      SimRequest request;
      request.tokens =
          Concat(families[rng_() % families.size()], RandomTokens(1 + rng_() % (3 * block_size)));
      request.salt = salts[rng_() % salts.size()];
      const PrefixMatch hit = kv->FindCachedPrefix(request.tokens, request.salt, true);
      check_hit(hit, request.tokens, request.salt);
      const int64_t size = request.tokens.size();
      const int64_t chunk = hit.num_tokens + 1 + rng_() % (size - hit.num_tokens);
      const int64_t id = next_id++;
      if (try_allocate(id, chunk, &hit)) {
        const std::vector<BlockId> table = Table(*kv, id);
        ASSERT_TRUE(std::equal(hit.blocks.begin(), hit.blocks.end(), table.begin()));
        request.computed = hit.num_tokens;
        SimRequest& stored = running[id] = std::move(request);
        compute(id, stored, chunk);
      }
    } else if (kind < 7 && !running.empty()) {  // next chunk, or decode a few tokens
      const int64_t id = random_running();
      SimRequest& request = running[id];
      if (request.computed == static_cast<int64_t>(request.tokens.size())) {
        const std::vector<int32_t> more = RandomTokens(1 + rng_() % 3);
        request.tokens.insert(request.tokens.end(), more.begin(), more.end());
      }
      const int64_t to = std::min<int64_t>(request.tokens.size(),
                                           request.computed + 1 + rng_() % (2 * block_size));
      // A stale prefix passed for a running request must be ignored.
      const PrefixMatch unrelated = kv->FindCachedPrefix(families[0], "", false);
      if (try_allocate(id, to, rng_() % 2 ? &unrelated : nullptr)) {
        compute(id, request, to);
      } else if (rng_() % 2) {  // preempt (recompute policy)
        kv->Free(id);
        running.erase(id);
      }
    } else if (kind < 9 && !running.empty()) {  // finish
      const int64_t id = random_running();
      kv->Free(id);
      running.erase(id);
      EXPECT_TRUE(kv->BlockTable(id).empty());
    } else {  // read-only lookup, or a repeated CacheBlocks (idempotent)
      if (!running.empty() && rng_() % 2) {
        const int64_t id = random_running();
        const SimRequest& request = running[id];
        const Snapshot before = snapshot();
        kv->CacheBlocks(id, request.tokens, request.salt, request.computed);
        EXPECT_TRUE(snapshot() == before) << "repeated CacheBlocks changed state";
      } else {
        const std::vector<int32_t> tokens =
            Concat(families[rng_() % families.size()], RandomTokens(rng_() % 3));
        const std::string& salt = salts[rng_() % salts.size()];
        check_hit(kv->FindCachedPrefix(tokens, salt, false), tokens, salt);
      }
    }
    ASSERT_THAT(kv->CheckInvariants(), IsOk()) << kv->CheckInvariants();
    ASSERT_FALSE(HasFailure());
  }
  // The run must have exercised sharing and pool pressure.
  EXPECT_GT(num_hit_blocks, 0);
  EXPECT_GT(num_failed, 0);

  for (const auto& [id, request] : running) kv->Free(id);
  EXPECT_EQ(kv->NumFreeBlocks(), num_blocks);
  EXPECT_LE(kv->Stats().num_cached_blocks, num_blocks);
  EXPECT_LE(kv->Stats().prefix_hit_tokens, kv->Stats().prefix_queried_tokens);
  EXPECT_THAT(kv->CheckInvariants(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, KvCacheStressTest, ::testing::Values(1, 4, 16));

}  // namespace
}  // namespace tandem::runtime
