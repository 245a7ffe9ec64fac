// RankKvReader through real transfer agents (InProcessAgent: one agent and pool per rank, like
// the worker's ranks): for P TP=a -> D TP=b over a, b in {1, 2, 4} (and replicated KV heads),
// every destination rank reads a request's blocks from a group handshake and ends up holding
// exactly its heads of the source's KV, block for block; blocks outside the request stay
// untouched; descriptors per destination rank stay at most (source ranks of its plan) x
// (contiguous runs) — never per token or head; each rank keeps exactly its share of the bytes.
// Both ways a re-shard can move: strided reads (InProcessAgent copies strided rows itself: one
// descriptor per run of blocks, only the kept bytes move) and staged ones (the same agent behind
// FaultInjectingAgent, which does not forward strided reads: whole blocks, then a scatter).
// Plus: a staging region smaller than the request (several chunks), cancel, an unlinked peer, and
// a data-parallel attention source (each block read from the rank holding it).
#include "kvtransfer/rank_reader.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/testing/fault_injecting_agent.h"

namespace tandem::kvtransfer {
namespace {

using tandem::v1::TransferHandshake;

constexpr int kLayers = 2, kBlockSize = 4, kHeadDim = 2;  // f32: 8 bytes per head row
constexpr int64_t kHeadBytes = kHeadDim * 4;

std::vector<RankHeads> Geometry(int num_kv_heads, int tp) {
  std::vector<RankHeads> out(tp);
  for (int r = 0; r < tp; ++r) {
    out[r] = tp <= num_kv_heads ? RankHeads{r * num_kv_heads / tp, num_kv_heads / tp}
                                : RankHeads{r / (tp / num_kv_heads), 1};
  }
  return out;
}

tandem::v1::CompatibilityInfo Layout(int num_kv_heads) {
  tandem::v1::CompatibilityInfo info;
  info.set_model_id("m");
  info.set_model_dtype("float32");
  tandem::v1::KvLayout* l = info.mutable_layout();
  l->set_layout_name("block_major_v1");
  l->set_num_layers(kLayers);
  l->set_num_kv_heads(num_kv_heads);
  l->set_head_dim(kHeadDim);
  l->set_block_size(kBlockSize);
  l->set_kv_dtype(tandem::v1::KV_DTYPE_F32);
  return info;
}

// One rank of a group: its agent and its pool of `blocks` blocks.
struct Rank {
  std::unique_ptr<InProcessAgent> agent;
  std::vector<char> pool;
  RankHeads heads;
  int64_t BlockBytes() const {
    return int64_t{kLayers} * 2 * kBlockSize * heads.head_count * kHeadBytes;
  }
  // Bytes of (block, layer*2+kv row, token, global head).
  const char* At(int32_t block, int64_t row, int64_t token, int head) const {
    return pool.data() + block * BlockBytes() +
           ((row * kBlockSize + token) * heads.head_count + (head - heads.head_begin)) * kHeadBytes;
  }
};

std::vector<Rank> MakeGroup(const std::shared_ptr<InProcessFabric>& fabric, const std::string& name,
                            int num_kv_heads, int tp, int blocks, std::mt19937& rng) {
  std::vector<Rank> group(tp);
  const std::vector<RankHeads> heads = Geometry(num_kv_heads, tp);
  for (int r = 0; r < tp; ++r) {
    group[r].heads = heads[r];
    group[r].agent = std::make_unique<InProcessAgent>(fabric, absl::StrCat(name, "-", r));
    group[r].pool.resize(static_cast<size_t>(blocks * group[r].BlockBytes()));
    for (char& c : group[r].pool) c = static_cast<char>(rng());
    // Replicated KV heads (tp > heads): every replica computed the same KV.
    for (int q = 0; q < r; ++q) {
      if (group[q].heads.head_begin == heads[r].head_begin) group[r].pool = group[q].pool;
    }
    EXPECT_TRUE(group[r]
                    .agent
                    ->RegisterMemory(group[r].pool.data(), group[r].pool.size(),
                                     tandem::v1::MEMORY_KIND_HOST)
                    .ok());
  }
  return group;
}

// The group's handshake as a worker's rank 0 publishes it (TransferHandshake.ranks).
TransferHandshake GroupHandshake(const std::vector<Rank>& group, int num_kv_heads) {
  TransferHandshake h;
  *h.mutable_compatibility() = Layout(num_kv_heads);
  for (size_t r = 0; r < group.size(); ++r) {
    TransferHandshake* rank = h.add_ranks();
    EXPECT_TRUE(group[r].agent->FillLocalDescriptor(rank).ok());
    rank->mutable_geometry()->set_tp_size(static_cast<uint32_t>(group.size()));
    rank->mutable_geometry()->set_tp_rank(static_cast<uint32_t>(r));
    rank->mutable_geometry()->set_kv_head_begin(group[r].heads.head_begin);
    rank->mutable_geometry()->set_kv_head_count(group[r].heads.head_count);
  }
  if (group.size() == 1) {  // a single rank publishes no list
    TransferHandshake single = h.ranks(0);
    *single.mutable_compatibility() = h.compatibility();
    return single;
  }
  return h;
}

RankKvReaderOptions ReaderOptions(Rank& rank, int num_kv_heads, int tp, int r, int blocks) {
  RankKvReaderOptions o;
  o.compatibility = Layout(num_kv_heads);
  o.geometry.set_tp_size(tp);
  o.geometry.set_tp_rank(r);
  o.geometry.set_kv_head_begin(rank.heads.head_begin);
  o.geometry.set_kv_head_count(rank.heads.head_count);
  o.pool_region = 0;
  o.pool = rank.pool.data();
  o.pool_blocks = blocks;
  return o;
}

absl::Status WaitFor(RankKvReader& reader, TransferId id) {
  for (int i = 0; i < 100000; ++i) {
    absl::StatusOr<bool> state = reader.CheckTransfer(id);
    if (!state.ok()) return state.status();
    if (*state) return absl::OkStatus();
    absl::SleepFor(absl::Microseconds(50));
  }
  return absl::DeadlineExceededError("read did not end");
}

struct Case {
  int num_kv_heads, src_tp, dst_tp;
  uint64_t staging_bytes;
};

TEST(RankKvReaderTest, EveryDestinationRankHoldsExactlyItsHeads) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<Case> cases;
  for (int a : {1, 2, 4}) {
    for (int b : {1, 2, 4}) cases.push_back({4, a, b, uint64_t{1} << 20});
  }
  cases.push_back({2, 4, 1, 1 << 20});  // source KV heads replicated
  cases.push_back({2, 1, 4, 1 << 20});  // destination KV heads replicated
  cases.push_back({4, 1, 2, 6 * 512});  // staging slots of 3 source blocks: several chunks
  cases.push_back({4, 2, 1, 2 * 256});  // slots of exactly one source block
  constexpr int kPoolBlocks = 24;
  for (const Case& c : cases) {
    for (const bool strided : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "Hkv " << c.num_kv_heads << " P TP=" << c.src_tp << " -> D TP=" << c.dst_tp
                   << " staging " << c.staging_bytes << (strided ? " strided" : " staged"));
      auto fabric = std::make_shared<InProcessFabric>();
      std::vector<Rank> src = MakeGroup(fabric, "p", c.num_kv_heads, c.src_tp, kPoolBlocks, rng);
      std::vector<Rank> dst = MakeGroup(fabric, "d", c.num_kv_heads, c.dst_tp, kPoolBlocks, rng);
      const TransferHandshake source = GroupHandshake(src, c.num_kv_heads);
      // A request of random length over random, partly consecutive blocks on both sides.
      const int n = 1 + static_cast<int>(rng() % 10);
      std::vector<int32_t> ids(kPoolBlocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<int32_t> src_blocks(ids.begin(), ids.begin() + n);
      std::sort(src_blocks.begin(), src_blocks.begin() + n / 2);  // some runs coalesce
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<int32_t> dst_blocks(ids.begin(), ids.begin() + n);
      std::vector<std::pair<int32_t, int32_t>> pairs;
      for (int i = 0; i < n; ++i) pairs.emplace_back(src_blocks[i], dst_blocks[i]);

      for (int r = 0; r < c.dst_tp; ++r) {
        SCOPED_TRACE(::testing::Message() << "D rank " << r);
        Rank& rank = dst[r];
        const std::vector<char> before = rank.pool;
        RankKvReaderOptions options = ReaderOptions(rank, c.num_kv_heads, c.dst_tp, r, kPoolBlocks);
        options.staging_bytes = c.staging_bytes;
        FaultInjectingAgent no_strided(rank.agent.get());
        TransferAgent* agent =
            strided ? static_cast<TransferAgent*>(rank.agent.get()) : &no_strided;
        RankKvReader reader(agent, options);
        ASSERT_TRUE(reader.AddSource("p", source).ok()) << reader.AddSource("p", source);
        absl::StatusOr<TransferId> id = reader.PostRead("p", pairs);
        ASSERT_TRUE(id.ok()) << id.status();
        ASSERT_TRUE(WaitFor(reader, *id).ok()) << WaitFor(reader, *id);
        // Every head of this rank, in every request block, equals the source rank's that holds it.
        for (int i = 0; i < n; ++i) {
          for (int h = rank.heads.head_begin; h < rank.heads.head_begin + rank.heads.head_count;
               ++h) {
            const Rank* holder = nullptr;
            for (const Rank& s : src) {
              if (h >= s.heads.head_begin && h < s.heads.head_begin + s.heads.head_count)
                holder = &s;
            }
            ASSERT_NE(holder, nullptr);
            for (int64_t row = 0; row < 2 * kLayers; ++row) {
              for (int t = 0; t < kBlockSize; ++t) {
                ASSERT_EQ(0, std::memcmp(rank.At(dst_blocks[i], row, t, h),
                                         holder->At(src_blocks[i], row, t, h), kHeadBytes))
                    << "block " << i << " head " << h << " row " << row << " token " << t;
              }
            }
          }
        }
        // Blocks outside the request are untouched.
        for (int32_t b = 0; b < kPoolBlocks; ++b) {
          if (std::find(dst_blocks.begin(), dst_blocks.end(), b) != dst_blocks.end()) continue;
          ASSERT_EQ(0, std::memcmp(rank.pool.data() + b * rank.BlockBytes(),
                                   before.data() + b * rank.BlockBytes(), rank.BlockBytes()));
        }
        const RankKvReaderStats stats = reader.stats();
        // Bulk: per source rank of the plan, at most one descriptor per contiguous run of the
        // request per staging chunk — never per token or head.
        const int64_t chunks = std::max<int64_t>(
            1, (n * src[0].BlockBytes() + c.staging_bytes / 2 - 1) / (c.staging_bytes / 2));
        EXPECT_LE(stats.copy_ops, static_cast<uint64_t>(c.src_tp * n));
        EXPECT_LE(stats.agent_reads, static_cast<uint64_t>(c.src_tp * chunks + c.src_tp));
        EXPECT_EQ(stats.bytes_kept, static_cast<uint64_t>(n * rank.BlockBytes()));
        if (strided) {
          // One agent read per source rank of the plan, and only the kept bytes move.
          EXPECT_LE(stats.agent_reads, static_cast<uint64_t>(c.src_tp));
          EXPECT_EQ(stats.bytes_read, stats.bytes_kept);
        }
      }
    }
  }
}

// A data-parallel attention source (RankGeometry.dp_size = 2): both ranks hold every head of
// their own blocks, group-wide block x on rank x % 2 at x / 2. Each destination rank (D TP=1 and
// TP=2, strided and staged) gets its heads of every block from the rank holding it.
TEST(RankKvReaderTest, DataParallelSourceServesEachBlockFromItsRank) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kHeads = 4, kDp = 2, kPoolBlocks = 12;
  for (const int dst_tp : {1, 2}) {
    for (const bool strided : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "D TP=" << dst_tp << (strided ? " strided" : " staged"));
      auto fabric = std::make_shared<InProcessFabric>();
      std::vector<Rank> src(kDp);
      for (int r = 0; r < kDp; ++r) {  // every rank all heads, its own (different) KV
        std::vector<Rank> one =
            MakeGroup(fabric, absl::StrCat("p", r), kHeads, 1, kPoolBlocks, rng);
        src[r] = std::move(one[0]);
      }
      TransferHandshake source = GroupHandshake(src, kHeads);
      for (int r = 0; r < kDp; ++r) source.mutable_ranks(r)->mutable_geometry()->set_dp_size(kDp);
      std::vector<Rank> dst = MakeGroup(fabric, "d", kHeads, dst_tp, kPoolBlocks, rng);
      // Group-wide ids of both ranks, interleaved and partly consecutive, into random blocks.
      const std::vector<int32_t> src_blocks = {3, 0, 1, 2, 7, 10, 5};
      std::vector<int32_t> ids(kPoolBlocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<std::pair<int32_t, int32_t>> pairs;
      for (size_t i = 0; i < src_blocks.size(); ++i) pairs.emplace_back(src_blocks[i], ids[i]);
      for (int r = 0; r < dst_tp; ++r) {
        Rank& rank = dst[r];
        FaultInjectingAgent no_strided(rank.agent.get());
        TransferAgent* agent =
            strided ? static_cast<TransferAgent*>(rank.agent.get()) : &no_strided;
        RankKvReader reader(agent, ReaderOptions(rank, kHeads, dst_tp, r, kPoolBlocks));
        ASSERT_TRUE(reader.AddSource("p", source).ok()) << reader.AddSource("p", source);
        absl::StatusOr<TransferId> id = reader.PostRead("p", pairs);
        ASSERT_TRUE(id.ok()) << id.status();
        ASSERT_TRUE(WaitFor(reader, *id).ok()) << WaitFor(reader, *id);
        for (const auto& [x, local] : pairs) {
          const Rank& holder = src[x % kDp];
          for (int h = rank.heads.head_begin; h < rank.heads.head_begin + rank.heads.head_count;
               ++h) {
            for (int64_t row = 0; row < 2 * kLayers; ++row) {
              for (int t = 0; t < kBlockSize; ++t) {
                ASSERT_EQ(0, std::memcmp(rank.At(local, row, t, h), holder.At(x / kDp, row, t, h),
                                         kHeadBytes))
                    << "block " << x << " head " << h << " row " << row << " token " << t;
              }
            }
          }
        }
        EXPECT_EQ(reader.stats().bytes_kept, pairs.size() * rank.BlockBytes());
      }
    }
  }
}

TEST(RankKvReaderTest, CancelUnlinkedBadBlocksAndDevicePools) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  std::vector<Rank> src = MakeGroup(fabric, "p", 4, 2, 8, rng);
  std::vector<Rank> dst = MakeGroup(fabric, "d", 4, 1, 8, rng);
  RankKvReader reader(dst[0].agent.get(), ReaderOptions(dst[0], 4, 1, 0, 8));
  const std::vector<std::pair<int32_t, int32_t>> pairs = {{0, 1}, {1, 2}, {5, 3}};
  EXPECT_EQ(reader.PostRead("p", pairs).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(reader.AddSource("p", GroupHandshake(src, 4)).ok());
  EXPECT_EQ(reader.PostRead("p", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader.PostRead("p", {{0, 8}}).status().code(), absl::StatusCode::kOutOfRange);

  // Cancelled while the agent holds its copies: ends CANCELLED, and only once every piece ended.
  const std::vector<char> before = dst[0].pool;
  dst[0].agent->HoldTransfers(true);
  absl::StatusOr<TransferId> id = reader.PostRead("p", pairs);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_FALSE(*reader.CheckTransfer(*id));
  reader.Cancel(*id);
  dst[0].agent->HoldTransfers(false);
  EXPECT_EQ(WaitFor(reader, *id).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(reader.CheckTransfer(*id).status().code(), absl::StatusCode::kNotFound);

  // A staged plan cannot scatter into a device pool (no host address): refused at link time,
  // naming the split, and nothing stays linked; a direct one (equal geometry) is fine, and so
  // is a strided one (the agent writes the pool itself).
  RankKvReaderOptions device = ReaderOptions(dst[0], 4, 1, 0, 8);
  device.pool = nullptr;
  FaultInjectingAgent no_strided(dst[0].agent.get());
  RankKvReader device_reader(&no_strided, device);
  const absl::Status staged = device_reader.AddSource("p", GroupHandshake(src, 4));
  EXPECT_EQ(staged.code(), absl::StatusCode::kUnimplemented) << staged;
  EXPECT_NE(staged.message().find("over 2 ranks"), std::string::npos) << staged;
  EXPECT_FALSE(device_reader.SourceLinked("p"));
  std::vector<Rank> single = MakeGroup(fabric, "q", 4, 1, 8, rng);
  EXPECT_TRUE(device_reader.AddSource("q", GroupHandshake(single, 4)).ok());
  RankKvReader strided_reader(dst[0].agent.get(), device);
  EXPECT_TRUE(strided_reader.AddSource("p", GroupHandshake(src, 4)).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
