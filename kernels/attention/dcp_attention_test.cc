// Decode context parallelism on the CPU: the shard placement arithmetic, cpu::PagedAttention on
// one KV shard (global query positions, local keys) against the fp64 reference restricted to the
// shard's keys, and the whole per-layer path (shard attention on every rank -> pack -> simulated
// all-to-all -> unpack + N-way merge) against unsharded PagedAttention.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/dcp_exchange.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

using ::tandem::kernels::attention_test::CaseOptions;
using ::tandem::kernels::attention_test::LseClose;
using ::tandem::kernels::attention_test::MakeDcpShardCase;
using ::tandem::kernels::attention_test::MakePagedCase;
using ::tandem::kernels::attention_test::OutClose;
using ::tandem::kernels::attention_test::PagedCase;
using ::tandem::kernels::attention_test::Reference;
using ::tandem::kernels::attention_test::ReferenceAttention;
using ::tandem::kernels::attention_test::SeqSpec;
using ::tandem::kernels::attention_test::TestSeed;

// fp32 kernel vs fp64 reference, as in paged_attention_test.cc.
constexpr double kOutTol = 1e-5;
constexpr double kLseTol = 1e-5;

using Result = ::tandem::kernels::attention_test::KernelResult;
using ::tandem::kernels::attention_test::RunCpuPagedAttention;

AttentionParams WithDcp(AttentionParams params, const DcpShard& dcp) {
  params.dcp_size = dcp.size;
  params.dcp_rank = dcp.rank;
  params.dcp_interleave = dcp.interleave;
  return params;
}

// Decode, speculative verification and prefill chunks, with contexts shorter than one block and
// shorter than one interleave unit (whole shards empty), and requests with no new tokens.
std::vector<SeqSpec> DcpBatch() {
  return {{1, 1},  {3, 1},   {77, 1}, {150, 5}, {41, 41}, {30, 0}, {0, 0},
          {16, 1}, {200, 1}, {95, 3}, {20, 7},  {5, 5},   {64, 1}};
}

TEST(DcpShardTest, PlacementMatchesEnumeration) {
  for (int64_t size = 1; size <= 5; ++size) {
    for (int64_t interleave : {1, 2, 3, 16}) {
      for (int64_t rank = 0; rank < size; ++rank) {
        const DcpShard dcp{size, rank, interleave};
        ASSERT_TRUE(DcpShardValid(dcp));
        // Enumerate global positions; the rank's tokens in order are its local indices.
        int64_t local = 0;
        for (int64_t g = 0; g < 300; ++g) {
          ASSERT_EQ(DcpLocalCount(g, dcp), local) << size << " " << rank << " " << interleave;
          if ((g / interleave) % size != rank) continue;
          ASSERT_EQ(DcpRankOf(g, dcp), rank);
          ASSERT_EQ(DcpGlobalPos(local, dcp), g);
          ++local;
        }
      }
    }
  }
  EXPECT_FALSE(DcpShardValid({0, 0, 1}));
  EXPECT_FALSE(DcpShardValid({2, 2, 1}));
  EXPECT_FALSE(DcpShardValid({2, -1, 1}));
  EXPECT_FALSE(DcpShardValid({2, 0, 0}));
  EXPECT_FALSE(DcpShardValid({4, 0, int64_t{1} << 29}));
}

// Every rank's shard attention against the reference over that shard's keys.
void CheckShards(std::mt19937& rng, const PagedCase& global, int64_t dcp_size, int64_t interleave,
                 const std::vector<AttentionParams>& param_sets, ThreadPool* pool) {
  int64_t empty_rows = 0;
  for (int64_t rank = 0; rank < dcp_size; ++rank) {
    const DcpShard dcp{dcp_size, rank, interleave};
    PagedCase shard = MakeDcpShardCase(rng, global, dcp);
    for (const AttentionParams& base : param_sets) {
      const AttentionParams params = WithDcp(base, dcp);
      SCOPED_TRACE(::testing::Message()
                   << "dcp " << dcp_size << " rank " << rank << " interleave " << interleave
                   << " window " << params.window_left << " softcap " << params.softcap);
      const Reference ref = ReferenceAttention(shard, params);
      const Result single = RunCpuPagedAttention(shard, params, nullptr);
      EXPECT_TRUE(OutClose(single.out, ref.out, kOutTol));
      EXPECT_TRUE(LseClose(single.lse, ref.lse, kLseTol));
      const Result threaded = RunCpuPagedAttention(shard, params, pool);
      EXPECT_TRUE(threaded.out == single.out) << "thread pool changed the output";
      EXPECT_TRUE(threaded.lse == single.lse) << "thread pool changed the lse";
      // A query that sees none of the shard: exactly out 0, lse -inf.
      const int64_t d = global.options.head_dim;
      for (size_t r = 0; r < ref.lse.size(); ++r) {
        if (!std::isinf(ref.lse[r])) continue;
        ++empty_rows;
        ASSERT_EQ(single.lse[r], -std::numeric_limits<float>::infinity()) << "row " << r;
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(single.out[r * d + i], 0.0f) << "row " << r;
      }
    }
  }
  EXPECT_GT(empty_rows, 0) << "the batch should leave some query with an empty shard";
}

struct ShardConfig {
  int64_t dcp_size;
  int64_t block_size;
  bool interleave_block;  // interleave = block_size, else 1
};

class DcpShardAttentionTest : public ::testing::TestWithParam<ShardConfig> {};

TEST_P(DcpShardAttentionTest, MatchesReference) {
  const ShardConfig cfg = GetParam();
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;  // 8 q heads, 2 kv heads
  options.head_dim = 64;
  options.block_size = cfg.block_size;
  options.q_stddev = 2.0f;
  const PagedCase global = MakePagedCase(rng, options, DcpBatch());
  ThreadPool pool(3);
  const float scale = 0.125f;
  CheckShards(rng, global, cfg.dcp_size, cfg.interleave_block ? cfg.block_size : 1,
              {AttentionParams{scale, -1, 0.0f}, AttentionParams{scale, 0, 0.0f},
               AttentionParams{scale, 17, 0.0f}, AttentionParams{scale, -1, 3.0f},
               AttentionParams{scale, 40, 1.5f}},
              &pool);
}

INSTANTIATE_TEST_SUITE_P(Configs, DcpShardAttentionTest,
                         ::testing::Values(ShardConfig{2, 16, false}, ShardConfig{2, 16, true},
                                           ShardConfig{4, 16, false}, ShardConfig{4, 16, true},
                                           ShardConfig{4, 8, true}, ShardConfig{3, 5, true}),
                         [](const ::testing::TestParamInfo<ShardConfig>& info) {
                           return "kvp" + std::to_string(info.param.dcp_size) + "_bs" +
                                  std::to_string(info.param.block_size) +
                                  (info.param.interleave_block ? "_il_block" : "_il_1");
                         });

TEST(DcpShardAttentionRandomTest, RandomShapes) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  ThreadPool pool(2);
  for (int trial = 0; trial < 12; ++trial) {
    CaseOptions options;
    options.num_kv_heads = 1 + rng() % 3;
    options.num_q_heads = options.num_kv_heads * (1 + rng() % 4);
    options.head_dim = 1 + rng() % 80;
    options.block_size = 1 + rng() % 20;
    options.q_stddev = 0.5f + (rng() % 30) / 10.0f;
    std::vector<SeqSpec> seqs(1 + rng() % 5);
    for (SeqSpec& s : seqs) {
      s.seq_len = rng() % 150;
      s.q_len = s.seq_len == 0 ? 0 : 1 + rng() % std::min<int64_t>(s.seq_len, 12);
    }
    seqs.push_back({1, 1});  // guarantees an empty shard for every size > 1
    const PagedCase global = MakePagedCase(rng, options, seqs);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(options.head_dim));
    params.window_left = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 60) : -1;
    params.softcap = rng() % 3 == 0 ? 1.0f + (rng() % 100) / 10.0f : 0.0f;
    const int64_t dcp_size = 2 + rng() % 4;
    const int64_t interleave = rng() % 2 == 0 ? options.block_size : 1 + rng() % 9;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " d " << options.head_dim << " bs " << options.block_size);
    CheckShards(rng, global, dcp_size, interleave, {params}, &pool);
  }
}

// dcp.size 1 is the ordinary path whatever the other fields hold: bitwise the same result.
TEST(DcpShardAttentionEdgeTest, SizeOneIsTheOrdinaryPath) {
  std::mt19937 rng(TestSeed());
  CaseOptions options;
  PagedCase c = MakePagedCase(rng, options, DcpBatch());
  const AttentionParams plain{0.125f, 23, 0.0f};
  const Result a = RunCpuPagedAttention(c, plain, nullptr);
  const AttentionParams one = WithDcp(plain, {1, 0, 7});
  std::vector<int32_t> junk(c.seqs.size(), -5);
  c.local_seq_lens = junk;  // ignored at size 1
  const Result b = RunCpuPagedAttention(c, one, nullptr);
  EXPECT_TRUE(a.out == b.out);
  EXPECT_TRUE(a.lse == b.lse);
}

// Simulates one layer on a DCP group of dcp_size ranks (TP_A = 1: every rank holds all kv heads):
// each rank attends its shard, packs, the all-to-all moves region j of rank k to region k of
// rank j, and each rank merges its heads; the heads put back together must equal unsharded
// attention.
void CheckPipeline(std::mt19937& rng, PagedCase& global, int64_t dcp_size, int64_t interleave,
                   const AttentionParams& params) {
  SCOPED_TRACE(::testing::Message() << "dcp " << dcp_size << " interleave " << interleave
                                    << " window " << params.window_left);
  const int64_t hq = global.options.num_q_heads, d = global.options.head_dim;
  const int64_t tokens = global.num_tokens;
  const DcpExchangeLayout layout{
      .num_tokens = tokens, .num_heads = hq, .head_dim = d, .dcp_size = dcp_size, .elem_bytes = 4};
  ASSERT_TRUE(layout.Validate().ok());
  const int64_t words = layout.BufferBytes() / 4;
  std::vector<std::vector<float>> send(dcp_size, std::vector<float>(words, -777.0f));
  for (int64_t k = 0; k < dcp_size; ++k) {
    PagedCase shard = MakeDcpShardCase(rng, global, {dcp_size, k, interleave});
    const Result partial =
        RunCpuPagedAttention(shard, WithDcp(params, {dcp_size, k, interleave}), nullptr);
    ASSERT_TRUE(
        DcpPackForExchange(partial.out.data(), partial.lse.data(), layout, send[k].data()).ok());
  }
  const int64_t hpr = hq / dcp_size;
  std::vector<float> merged_out(tokens * hq * d), merged_lse(tokens * hq);
  for (int64_t j = 0; j < dcp_size; ++j) {
    std::vector<float> recv(words, -999.0f);
    for (int64_t k = 0; k < dcp_size; ++k) {
      std::memcpy(reinterpret_cast<char*>(recv.data()) + k * layout.RegionBytes(),
                  reinterpret_cast<const char*>(send[k].data()) + j * layout.RegionBytes(),
                  layout.RegionBytes());
    }
    std::vector<float> out(tokens * hpr * d, 555.0f), lse(tokens * hpr, 555.0f);
    ASSERT_TRUE(DcpMergeReceived(recv.data(), layout, out.data(), lse.data()).ok());
    for (int64_t t = 0; t < tokens; ++t) {  // rank j's heads go back to [j * hpr, (j + 1) * hpr)
      std::copy_n(out.begin() + t * hpr * d, hpr * d, merged_out.begin() + (t * hq + j * hpr) * d);
      std::copy_n(lse.begin() + t * hpr, hpr, merged_lse.begin() + t * hq + j * hpr);
    }
  }
  const Result full = RunCpuPagedAttention(global, params, nullptr);
  EXPECT_TRUE(OutClose(merged_out, std::vector<double>(full.out.begin(), full.out.end()), 1e-5));
  EXPECT_TRUE(LseClose(merged_lse, std::vector<double>(full.lse.begin(), full.lse.end()), 1e-5));
  const Reference ref = ReferenceAttention(global, params);
  EXPECT_TRUE(OutClose(merged_out, ref.out, kOutTol));
  EXPECT_TRUE(LseClose(merged_lse, ref.lse, kLseTol));
}

TEST(DcpPipelineTest, ShardedLayerEqualsUnshardedAttention) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int64_t block_size : {1, 16}) {
    CaseOptions options;
    options.num_q_heads = 16;  // divisible by every dcp_size below
    options.num_kv_heads = 4;
    options.head_dim = 128;
    options.block_size = block_size;
    options.q_stddev = 2.0f;
    PagedCase global = MakePagedCase(rng, options, DcpBatch());
    for (int64_t dcp_size : {2, 4}) {
      for (int64_t interleave : {int64_t{1}, block_size, int64_t{3}}) {
        for (const AttentionParams& params :
             {AttentionParams{0.09f, -1, 0.0f}, AttentionParams{0.09f, 33, 2.5f}}) {
          CheckPipeline(rng, global, dcp_size, interleave, params);
        }
      }
    }
  }
}

TEST(DcpPipelineTest, RandomShapes) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 10; ++trial) {
    const int64_t dcp_size = 2 + rng() % 4;
    CaseOptions options;
    options.num_kv_heads = 1 + rng() % 2;
    options.num_q_heads = dcp_size * options.num_kv_heads * (1 + rng() % 2);
    options.head_dim = 1 + rng() % 70;
    options.block_size = 1 + rng() % 17;
    std::vector<SeqSpec> seqs(1 + rng() % 4);
    for (SeqSpec& s : seqs) {
      s.seq_len = 1 + rng() % 180;
      s.q_len = 1 + rng() % std::min<int64_t>(s.seq_len, 9);
    }
    PagedCase global = MakePagedCase(rng, options, seqs);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(options.head_dim));
    params.window_left = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 80) : -1;
    const int64_t interleave = rng() % 2 == 0 ? options.block_size : 1 + rng() % 7;
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    CheckPipeline(rng, global, dcp_size, interleave, params);
  }
}

// Invalid DCP arguments are INVALID_ARGUMENT and leave out/lse untouched.
TEST(DcpShardAttentionValidationTest, RejectsBadShards) {
  std::mt19937 rng(TestSeed());
  CaseOptions options;
  options.block_size = 4;
  const PagedCase global = MakePagedCase(rng, options, {{10, 2}, {5, 5}, {9, 1}});
  PagedCase shard = MakeDcpShardCase(rng, global, {2, 1, 4});
  std::vector<float> out(shard.num_tokens * 8 * 64, 3.0f), lse(shard.num_tokens * 8, 3.0f);
  auto call = [&](const AttentionBatch& batch, const DcpShard& dcp) {
    const AttentionParams params = WithDcp({0.125f, -1, 0.0f}, dcp);
    return PagedAttention(shard.q.data(), 8, shard.View(), 1, batch, params, out.data(), lse.data(),
                          nullptr);
  };
  auto expect_invalid = [&](const absl::Status& status, absl::string_view mentions) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(mentions), absl::string_view::npos) << status;
    for (float x : out) ASSERT_EQ(x, 3.0f) << "out written by a rejected call";
    for (float x : lse) ASSERT_EQ(x, 3.0f) << "lse written by a rejected call";
  };
  EXPECT_TRUE(call(shard.Batch(), {2, 1, 4}).ok());
  out.assign(out.size(), 3.0f);
  lse.assign(lse.size(), 3.0f);
  expect_invalid(call(shard.Batch(), {0, 0, 4}), "dcp shard");
  expect_invalid(call(shard.Batch(), {2, 2, 4}), "dcp shard");
  expect_invalid(call(shard.Batch(), {2, 1, 0}), "dcp shard");
  // The wrong rank or interleave for these local lengths.
  expect_invalid(call(shard.Batch(), {2, 0, 4}), "local_seq_lens[");
  expect_invalid(call(shard.Batch(), {2, 1, 1}), "local_seq_lens[");
  AttentionBatch batch = shard.Batch();
  batch.local_seq_lens = nullptr;
  expect_invalid(call(batch, {2, 1, 4}), "local_seq_lens must be non-null");
  std::vector<int32_t> lens = shard.local_seq_lens;
  lens[0] += 1;
  batch = shard.Batch();
  batch.local_seq_lens = lens.data();
  expect_invalid(call(batch, {2, 1, 4}), "local_seq_lens[0]");
  // Local length beyond the block table.
  batch = shard.Batch();
  batch.max_blocks_per_seq = 0;
  expect_invalid(call(batch, {2, 1, 4}), "local_seq_len ");
}

}  // namespace
}  // namespace tandem::kernels::cpu
