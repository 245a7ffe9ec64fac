// Re-sharding between TP groups on fresh random pools: for P TP=a -> D TP=b over every a, b in
// {1, 2, 4} (and 8 with KV heads replicated), each destination rank's blocks, assembled from the
// plan's pieces (direct block copies where the geometry is equal, gather -> one staging region ->
// scatter otherwise), hold exactly its heads of the logical KV; blocks outside the request are
// untouched; descriptors per destination rank stay at one per piece (<= source ranks), not per
// block, token or head; each destination rank receives exactly its share of the bytes.
#include "kvtransfer/reshard.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

// The tensor-parallel rule (runtime/model/tensor_parallel.h): KV heads split when tp divides
// them, else each rank holds the one head its query heads use.
std::vector<RankHeads> Geometry(int num_kv_heads, int tp) {
  std::vector<RankHeads> out(tp);
  for (int r = 0; r < tp; ++r) {
    if (tp <= num_kv_heads) {
      out[r] = {r * num_kv_heads / tp, num_kv_heads / tp};
    } else {
      out[r] = {r / (tp / num_kv_heads), 1};
    }
  }
  return out;
}

struct Case {
  int num_kv_heads, src_tp, dst_tp;
};

TEST(ReshardTest, EveryDestinationRankGetsExactlyItsHeads) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<Case> cases;
  for (int a : {1, 2, 4}) {
    for (int b : {1, 2, 4}) cases.push_back({4, a, b});
  }
  cases.push_back({2, 4, 1});  // source KV heads replicated
  cases.push_back({2, 1, 8});  // destination KV heads replicated
  cases.push_back({2, 8, 4});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "Hkv " << c.num_kv_heads << " P TP=" << c.src_tp << " -> D TP=" << c.dst_tp);
    const int64_t L = 2, bs = 4, head_bytes = 8, n = 1 + rng() % 6;  // request blocks
    const int64_t H = c.num_kv_heads;
    // Logical KV of the request: [block][layer][kv][token][head][head_bytes].
    std::vector<char> logical(n * L * 2 * bs * H * head_bytes);
    for (char& x : logical) x = static_cast<char>(rng());
    auto logical_at = [&](int64_t blk, int64_t row, int64_t h) {
      return logical.data() + ((blk * L * 2 * bs + row) * H + h) * head_bytes;
    };
    auto pick_blocks = [&](int64_t pool_blocks) {
      std::vector<int32_t> ids(pool_blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(n);
      return ids;
    };
    // Source pools.
    const std::vector<RankHeads> src = Geometry(c.num_kv_heads, c.src_tp);
    const int64_t src_pool_blocks = n + 3;
    std::vector<std::vector<char>> src_pools(c.src_tp);
    std::vector<std::vector<int32_t>> src_ids(c.src_tp);
    for (int r = 0; r < c.src_tp; ++r) {
      const BlockShape shape{L, bs, src[r].head_count, head_bytes};
      src_pools[r].resize(src_pool_blocks * shape.BlockBytes());
      src_ids[r] = pick_blocks(src_pool_blocks);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t row = 0; row < L * 2 * bs; ++row) {
          for (int h = 0; h < src[r].head_count; ++h) {
            std::copy_n(logical_at(i, row, src[r].head_begin + h), head_bytes,
                        src_pools[r].data() + src_ids[r][i] * shape.BlockBytes() +
                            (row * src[r].head_count + h) * head_bytes);
          }
        }
      }
    }
    // Destination ranks.
    const std::vector<RankHeads> dst = Geometry(c.num_kv_heads, c.dst_tp);
    for (int s = 0; s < c.dst_tp; ++s) {
      const BlockShape dshape{L, bs, dst[s].head_count, head_bytes};
      const int64_t dst_pool_blocks = n + 2;
      std::vector<char> pool(dst_pool_blocks * dshape.BlockBytes());
      for (char& x : pool) x = static_cast<char>(rng());
      const std::vector<char> before = pool;
      const std::vector<int32_t> ids = pick_blocks(dst_pool_blocks);
      auto plan = PlanReshard(src, dst[s], s);
      ASSERT_TRUE(plan.ok()) << plan.status();
      int descriptors = 0;
      int64_t received = 0;
      for (const ReshardPiece& p : *plan) {
        const RankHeads& from = src[p.src_rank];
        const BlockShape sshape{L, bs, from.head_count, head_bytes};
        if (IsDirect(p, from, dst[s])) {
          for (int64_t i = 0; i < n; ++i) {  // one read per contiguous run of source blocks
            std::copy_n(src_pools[p.src_rank].data() + src_ids[p.src_rank][i] * sshape.BlockBytes(),
                        sshape.BlockBytes(), pool.data() + ids[i] * dshape.BlockBytes());
            if (i == 0 || src_ids[p.src_rank][i] != src_ids[p.src_rank][i - 1] + 1) ++descriptors;
            received += sshape.BlockBytes();
          }
          continue;
        }
        const int64_t bytes = StagingBytes(sshape, n, p.head_count);
        std::vector<char> staging(bytes), wire(bytes);
        ASSERT_TRUE(GatherHeads(src_pools[p.src_rank].data(), sshape, src_pool_blocks,
                                src_ids[p.src_rank], p.head_begin - from.head_begin, p.head_count,
                                staging.data(), bytes)
                        .ok());
        wire = staging;  // the transfer: one region, one descriptor
        ++descriptors;
        received += bytes;
        ASSERT_TRUE(ScatterHeads(wire.data(), bytes, pool.data(), dshape, dst_pool_blocks, ids,
                                 p.head_begin - dst[s].head_begin, p.head_count)
                        .ok());
      }
      EXPECT_LE(descriptors, std::max<int>(c.src_tp, n)) << "rank " << s;
      if (!(c.src_tp == c.dst_tp)) {
        EXPECT_LE(descriptors, c.src_tp) << "staged: one descriptor per source rank at most";
      }
      EXPECT_EQ(received, n * dshape.BlockBytes()) << "rank " << s << " gets its share";
      for (int64_t blk = 0; blk < dst_pool_blocks; ++blk) {
        const auto at = std::find(ids.begin(), ids.end(), blk);
        for (int64_t row = 0; row < L * 2 * bs; ++row) {
          for (int h = 0; h < dst[s].head_count; ++h) {
            const int64_t off =
                blk * dshape.BlockBytes() + (row * dst[s].head_count + h) * head_bytes;
            const char* want = at == ids.end()
                                   ? before.data() + off
                                   : logical_at(at - ids.begin(), row, dst[s].head_begin + h);
            ASSERT_TRUE(std::equal(want, want + head_bytes, pool.data() + off))
                << "rank " << s << " block " << blk << " row " << row << " head " << h;
          }
        }
      }
    }
  }
}

TEST(ReshardTest, ReplicatedHeadsSpreadReadersAndMissingHeadsAreErrors) {
  // 2 KV heads over P TP=4: ranks {0,1} hold head 0, {2,3} head 1; D TP=2 ranks read different
  // replicas.
  const std::vector<RankHeads> src = Geometry(2, 4);
  auto r0 = PlanReshard(src, {0, 1}, 0), r1 = PlanReshard(src, {1, 1}, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ((*r0)[0].src_rank, 0);
  EXPECT_EQ((*r1)[0].src_rank, 3);
  const std::vector<RankHeads> partial = {{0, 2}};
  EXPECT_EQ(PlanReshard(partial, {0, 4}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  const BlockShape shape{1, 2, 2, 4};
  std::vector<char> pool(2 * shape.BlockBytes()), staging(StagingBytes(shape, 1, 1));
  const std::vector<int32_t> blocks = {1};
  EXPECT_TRUE(
      GatherHeads(pool.data(), shape, 2, blocks, 1, 1, staging.data(), staging.size()).ok());
  EXPECT_FALSE(
      GatherHeads(pool.data(), shape, 2, blocks, 2, 1, staging.data(), staging.size()).ok());
  EXPECT_FALSE(
      GatherHeads(pool.data(), shape, 1, blocks, 0, 1, staging.data(), staging.size()).ok());
  EXPECT_FALSE(GatherHeads(pool.data(), shape, 2, blocks, 0, 1, staging.data(), 3).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
