#include "runtime/kv_cache/dcp_blocks.h"

#include <cstdint>
#include <iterator>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/dcp_shard.h"
#include "runtime/kv_cache/kv_cache_manager.h"

namespace tandem::runtime {
namespace {

// Brute force: the (shard, local block) pairs the tokens [0, n) occupy, from the kernels' token
// arithmetic alone.
std::set<std::pair<int64_t, int64_t>> OccupiedBlocks(const DcpBlockLayout& d, int64_t n) {
  std::set<std::pair<int64_t, int64_t>> out;
  for (int64_t g = 0; g < n; ++g) {
    const int64_t k = kernels::DcpRankOf(g, d.Shard(0));
    const int64_t j = kernels::DcpLocalCount(g, d.Shard(k));  // local index of g on k
    out.insert({k, j / d.block_size});
  }
  return out;
}

TEST(DcpBlocksTest, LogicalBlocksAreExactlyTheOccupiedShardBlocks) {
  for (int64_t size : {1, 2, 3, 4}) {
    for (int64_t bs : {1, 4, 16}) {
      for (int64_t interleave : {1, 2, 4, 16, 32, 64}) {
        const DcpBlockLayout d{size, interleave, bs};
        if (!d.Validate().ok()) continue;
        for (int64_t n = 0; n <= 300; n += (n < 40 ? 1 : 7)) {
          const std::set<std::pair<int64_t, int64_t>> want = OccupiedBlocks(d, n);
          // Logical blocks [0, NumBlocks(n)), numbered per shard in order.
          std::set<std::pair<int64_t, int64_t>> got;
          std::vector<int64_t> next_local(size, 0);
          for (int64_t i = 0; i < d.NumBlocks(n); ++i) {
            const int64_t k = d.ShardOfBlock(i);
            got.insert({k, next_local[k]++});
          }
          ASSERT_EQ(got, want) << "size " << size << " bs " << bs << " I " << interleave << " n "
                               << n;
          for (int64_t k = 0; k < size; ++k) EXPECT_EQ(d.NumShardBlocks(n, k), next_local[k]);
        }
      }
    }
  }
}

// The one owner of DCP placement: the flags' "interleave 0 = the block size", shard = TP rank %
// dcp (the kernels' DcpShardOfTpRank), and block id x on shard x % size at local x / size, which
// ShardLocalBlocks and every shard's DcpShard agree with.
TEST(DcpBlocksTest, FromFlagsOwnsThePlacement) {
  EXPECT_EQ(DcpBlockLayout::FromFlags(2, 0, 16).interleave, 16);
  EXPECT_EQ(DcpBlockLayout::FromFlags(2, 4, 16).interleave, 4);
  EXPECT_EQ(DcpBlockLayout::FromFlags(4, 32, 16).block_size, 16);
  const DcpBlockLayout dcp = DcpBlockLayout::FromFlags(2, 0, 4);
  for (int64_t tp_rank = 0; tp_rank < 6; ++tp_rank) {
    EXPECT_EQ(dcp.ShardOfTpRank(tp_rank), tp_rank % 2);
    EXPECT_EQ(kernels::DcpShardOfTpRank(tp_rank, 2), tp_rank % 2);
    const kernels::DcpShard shard = dcp.ShardForTpRank(tp_rank);
    EXPECT_EQ(shard.size, 2);
    EXPECT_EQ(shard.rank, tp_rank % 2);
    EXPECT_EQ(shard.interleave, 4);
  }
  const std::vector<int32_t> table = {6, 3, 8, 1, 4, 11};  // logical order, shards 0 1 0 1 0 1
  for (int64_t shard = 0; shard < 2; ++shard) {
    std::vector<int32_t> local;
    dcp.ShardLocalBlocks(table, shard, std::back_inserter(local));
    std::vector<int32_t> want;
    for (size_t i = 0; i < table.size(); ++i) {
      EXPECT_EQ(dcp.ShardOfId(table[i]), dcp.ShardOfBlock(static_cast<int64_t>(i)));
      if (dcp.ShardOfId(table[i]) == shard)
        want.push_back(static_cast<int32_t>(dcp.LocalId(table[i])));
    }
    EXPECT_EQ(local, want);
    EXPECT_EQ(local.size(), 3u);
  }
}

TEST(DcpBlocksTest, ValidateNamesTheNumbers) {
  EXPECT_TRUE((DcpBlockLayout{2, 16, 16}.Validate().ok()));
  EXPECT_TRUE((DcpBlockLayout{2, 32, 16}.Validate().ok()));
  EXPECT_TRUE((DcpBlockLayout{2, 4, 16}.Validate().ok()));
  const absl::Status bad = DcpBlockLayout{2, 24, 16}.Validate();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--dcp_interleave=24"), absl::string_view::npos) << bad;
  EXPECT_NE(bad.message().find("block size 16"), absl::string_view::npos) << bad;
  EXPECT_FALSE((DcpBlockLayout{0, 16, 16}.Validate().ok()));
  EXPECT_TRUE((DcpBlockLayout{1, 24, 16}.Validate().ok()));  // no DCP: interleave unused
}

std::unique_ptr<KvCacheManager> MakeManager(int64_t num_blocks, int64_t dcp, int64_t interleave) {
  KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = 4;
  config.dcp_size = dcp;
  config.dcp_interleave = interleave;
  auto manager = KvCacheManager::Create(config);
  EXPECT_TRUE(manager.ok()) << manager.status();
  return std::move(manager).value();
}

TEST(DcpKvCacheTest, BlocksComeFromTheirShard) {
  auto kv = MakeManager(/*num_blocks=*/12, /*dcp=*/3, /*interleave=*/0);
  ASSERT_TRUE(kv->Allocate(1, 17, nullptr));  // 5 blocks: shards 0,1,2,0,1
  const absl::Span<const BlockId> table = kv->BlockTable(1);
  ASSERT_EQ(table.size(), 5u);
  for (size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table[i] % 3, static_cast<int>(i % 3));
  EXPECT_EQ(kv->NumFreeBlocksOnShard(0), 2);
  EXPECT_EQ(kv->NumFreeBlocksOnShard(1), 2);
  EXPECT_EQ(kv->NumFreeBlocksOnShard(2), 3);
  EXPECT_TRUE(kv->CheckInvariants().ok()) << kv->CheckInvariants();
  kv->Free(1);
  EXPECT_EQ(kv->NumFreeBlocks(), 12);
  EXPECT_TRUE(kv->CheckInvariants().ok());
}

TEST(DcpKvCacheTest, CapacityIsTheSumOverShardsAndAShortShardRefusesCleanly) {
  // 2 shards x 4 blocks of 4 tokens: 32 tokens fit, one rank alone would hold 16.
  auto kv = MakeManager(8, 2, 0);
  EXPECT_EQ(kv->NumBlocksNeeded(1, 32, nullptr), 8);
  ASSERT_TRUE(kv->Allocate(1, 32, nullptr));
  EXPECT_EQ(kv->NumFreeBlocks(), 0);
  kv->Free(1);
  // Shard 0 short: a request holding logical blocks 0, 2, 4 (shard 0) and 1, 3 (shard 1).
  ASSERT_TRUE(kv->Allocate(2, 20, nullptr));
  EXPECT_EQ(kv->NumFreeBlocksOnShard(0), 1);
  EXPECT_EQ(kv->NumFreeBlocksOnShard(1), 2);
  // 3 more blocks (logical 0..2 of a new request: shards 0, 1, 0) need 2 on shard 0: refused, no
  // change, although 3 blocks are free in all.
  EXPECT_FALSE(kv->Allocate(3, 12, nullptr));
  EXPECT_TRUE(kv->BlockTable(3).empty());
  EXPECT_EQ(kv->NumFreeBlocks(), 3);
  ASSERT_TRUE(kv->Allocate(3, 8, nullptr));  // shards 0 and 1: fits
  EXPECT_TRUE(kv->CheckInvariants().ok()) << kv->CheckInvariants();
}

TEST(DcpKvCacheTest, PrefixCacheSharesWholeBlocksAcrossShards) {
  auto kv = MakeManager(16, 2, 0);
  std::vector<int32_t> prompt(13);
  std::iota(prompt.begin(), prompt.end(), 100);
  ASSERT_TRUE(kv->Allocate(1, 13, nullptr));
  kv->CacheBlocks(1, prompt, "", 13);
  PrefixMatch hit = kv->FindCachedPrefix(prompt, "", true);
  ASSERT_EQ(hit.num_tokens, 12);
  ASSERT_TRUE(kv->Allocate(2, 13, &hit));
  const absl::Span<const BlockId> a = kv->BlockTable(1), b = kv->BlockTable(2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]);
  EXPECT_NE(a[3], b[3]);
  EXPECT_EQ(b[3] % 2, 1);  // logical block 3 lives on shard 1
  EXPECT_TRUE(kv->CheckInvariants().ok()) << kv->CheckInvariants();
}

TEST(DcpKvCacheTest, TokenInterleaveDisablesPrefixCaching) {
  auto kv = MakeManager(16, 2, /*interleave=*/1);
  std::vector<int32_t> prompt(13, 7);
  ASSERT_TRUE(kv->Allocate(1, 13, nullptr));  // shard 0 holds 7 tokens (2 blocks), shard 1 6 (2)
  EXPECT_EQ(kv->BlockTable(1).size(), 4u);
  kv->CacheBlocks(1, prompt, "", 13);
  EXPECT_EQ(kv->FindCachedPrefix(prompt, "", false).num_tokens, 0);
  EXPECT_TRUE(kv->CheckInvariants().ok()) << kv->CheckInvariants();
}

TEST(DcpKvCacheTest, CreateRefusesPoolsThatDoNotSplit) {
  KvCacheConfig config;
  config.num_blocks = 7;
  config.block_size = 4;
  config.dcp_size = 2;
  EXPECT_EQ(KvCacheManager::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.num_blocks = 8;
  config.dcp_interleave = 6;
  EXPECT_EQ(KvCacheManager::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
