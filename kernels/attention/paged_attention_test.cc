#include "kernels/attention/paged_attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/fp8/fp8.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

using ::tandem::kernels::attention_test::CaseOptions;
using ::tandem::kernels::attention_test::LseClose;
using ::tandem::kernels::attention_test::MakePagedCase;
using ::tandem::kernels::attention_test::OutClose;
using ::tandem::kernels::attention_test::PagedCase;
using ::tandem::kernels::attention_test::Reference;
using ::tandem::kernels::attention_test::ReferenceAttention;
using ::tandem::kernels::attention_test::SeqSpec;
using ::tandem::kernels::attention_test::TestSeed;

// fp32 kernel vs fp64 reference: max |out - ref| <= kOutTol * max|ref| over the batch, and
// |lse - ref| <= kLseTol * max(1, |ref|).
constexpr double kOutTol = 1e-5;
constexpr double kLseTol = 1e-5;

using Result = ::tandem::kernels::attention_test::KernelResult;
using ::tandem::kernels::attention_test::RunCpuPagedAttention;

// Runs single-threaded and on a pool, checks both against the reference and each other.
void CheckAgainstReference(PagedCase& c, const AttentionParams& params, ThreadPool* pool) {
  SCOPED_TRACE(::testing::Message()
               << "window_left=" << params.window_left << " softcap=" << params.softcap);
  const Reference ref = ReferenceAttention(c, params);
  const Result single = RunCpuPagedAttention(c, params, nullptr);
  EXPECT_TRUE(OutClose(single.out, ref.out, kOutTol));
  EXPECT_TRUE(LseClose(single.lse, ref.lse, kLseTol));
  const Result threaded = RunCpuPagedAttention(c, params, pool);
  // Each work item runs the same code on one thread, so the thread count changes nothing.
  EXPECT_TRUE(threaded.out == single.out) << "thread pool changed the output";
  EXPECT_TRUE(threaded.lse == single.lse) << "thread pool changed the lse";
}

// The mix the engine sees in one step: first decode step, long decodes, speculative
// verification, pure prefill, extend over a prefix, and requests with no new tokens.
std::vector<SeqSpec> MixedBatch() {
  return {{1, 1}, {77, 1},  {150, 5}, {41, 41}, {30, 0}, {64, 20},
          {0, 0}, {200, 1}, {16, 16}, {95, 3},  {33, 1}};
}

struct HeadConfig {
  int64_t num_q_heads;
  int64_t num_kv_heads;
};
void PrintTo(const HeadConfig& h, std::ostream* os) {
  *os << h.num_q_heads << " q heads / " << h.num_kv_heads << " kv heads";
}

class PagedAttentionTest
    : public ::testing::TestWithParam<
          std::tuple<HeadConfig, int64_t /*head_dim*/, int64_t /*block_size*/>> {};

TEST_P(PagedAttentionTest, MatchesReference) {
  const auto [heads, head_dim, block_size] = GetParam();
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.num_q_heads = heads.num_q_heads;
  options.num_kv_heads = heads.num_kv_heads;
  options.head_dim = head_dim;
  options.block_size = block_size;
  options.q_stddev = 2.0f;  // scores with std ~2: a peaked softmax, not a near-uniform one
  PagedCase c = MakePagedCase(rng, options, MixedBatch());
  ThreadPool pool(3);

  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (const AttentionParams& params :
       {AttentionParams{scale, -1, 0.0f}, AttentionParams{scale, 0, 0.0f},
        AttentionParams{scale, 17, 0.0f}, AttentionParams{scale, -1, 3.0f},
        AttentionParams{scale, 40, 1.5f}}) {
    CheckAgainstReference(c, params, &pool);
  }
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<HeadConfig, int64_t, int64_t>>& info) {
  const auto [heads, head_dim, block_size] = info.param;
  return "q" + std::to_string(heads.num_q_heads) + "kv" + std::to_string(heads.num_kv_heads) +
         "_d" + std::to_string(head_dim) + "_bs" + std::to_string(block_size);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(HeadConfig{4, 4},   // MHA (group 1)
                                                              HeadConfig{4, 2},   // group 2
                                                              HeadConfig{8, 2},   // group 4
                                                              HeadConfig{16, 2},  // group 8
                                                              HeadConfig{8, 1}),  // MQA
                                            ::testing::Values(64, 128, 37),
                                            ::testing::Values(1, 16, 32)),
                         ParamName);

TEST(PagedAttentionRandomTest, RandomBatches) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  ThreadPool pool(2);
  const HeadConfig head_configs[] = {{1, 1}, {6, 3}, {12, 4}, {32, 4}, {5, 1}};
  for (int trial = 0; trial < 25; ++trial) {
    CaseOptions options;
    const HeadConfig heads = head_configs[rng() % 5];
    options.num_q_heads = heads.num_q_heads;
    options.num_kv_heads = heads.num_kv_heads;
    options.head_dim = 1 + rng() % 100;
    options.block_size = 1 + rng() % 20;
    options.num_layers = 1 + rng() % 3;
    options.layer = rng() % options.num_layers;
    options.q_stddev = 0.5f + (rng() % 40) / 10.0f;
    std::vector<SeqSpec> seqs(rng() % 6);
    for (SeqSpec& s : seqs) {
      s.seq_len = rng() % 120;
      s.q_len = s.seq_len == 0 ? 0 : rng() % (s.seq_len + 1);
      if (rng() % 3 == 0) s.q_len = std::min<int64_t>(s.seq_len, 1);
    }
    PagedCase c = MakePagedCase(rng, options, seqs);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(options.head_dim));
    params.window_left = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 50) : -1;
    params.softcap = rng() % 3 == 0 ? 1.0f + (rng() % 100) / 10.0f : 0.0f;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " heads " << heads.num_q_heads << "/" << heads.num_kv_heads
                 << " d " << options.head_dim << " bs " << options.block_size);
    CheckAgainstReference(c, params, &pool);
  }
}

// An FP8 pool (Fp8KvCacheView): the case's pool quantized with random per-tensor scales. The
// kernel must give bitwise what it gives over an f32 pool holding code * scale, any thread count,
// with DCP-free random batches, windows and soft-caps; and that f32 run is near the fp64
// reference of the dequantized values (the same tolerance as the f32 tests).
TEST(PagedAttentionFp8Test, EqualsTheF32PoolOfItsValues) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  ThreadPool pool(3);
  const HeadConfig head_configs[] = {{4, 4}, {8, 2}, {16, 2}, {6, 3}, {5, 1}};
  for (int trial = 0; trial < 12; ++trial) {
    CaseOptions options;
    const HeadConfig heads = head_configs[trial % 5];
    options.num_q_heads = heads.num_q_heads;
    options.num_kv_heads = heads.num_kv_heads;
    options.head_dim = trial < 4 ? 64 * (1 + trial % 2) : 1 + rng() % 100;
    options.block_size = 1 + rng() % 20;
    options.kv_stddev = 0.1f + (rng() % 30) / 10.0f;
    std::vector<SeqSpec> seqs = trial % 2 == 0 ? MixedBatch() : std::vector<SeqSpec>(1 + rng() % 5);
    for (SeqSpec& q : seqs) {
      if (trial % 2 == 0) continue;
      q.seq_len = 1 + rng() % 150;
      q.q_len = 1 + rng() % q.seq_len;
    }
    PagedCase c = MakePagedCase(rng, options, seqs);
    Fp8KvCacheView fp8{nullptr, c.layout, 0.002f + (rng() % 100) / 1000.0f,
                       0.002f + (rng() % 100) / 1000.0f};
    std::vector<uint8_t> codes(c.pool.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const bool is_v = (static_cast<int64_t>(i) / c.layout.TileElems()) % 2 == 1;
      const float scale = is_v ? fp8.v_scale : fp8.k_scale;
      codes[i] = FloatToFp8E4m3(c.pool[i] / scale);
      c.pool[i] = Fp8E4m3ToFloat(codes[i]) * scale;  // the f32 pool of the codes' values
    }
    fp8.data = codes.data();
    // The reference's per-sequence K / V copies: the same values.
    for (size_t q = 0; q < c.seqs.size(); ++q) {
      for (size_t i = 0; i < c.k[q].size(); ++i) {
        c.k[q][i] = Fp8E4m3ToFloat(FloatToFp8E4m3(c.k[q][i] / fp8.k_scale)) * fp8.k_scale;
        c.v[q][i] = Fp8E4m3ToFloat(FloatToFp8E4m3(c.v[q][i] / fp8.v_scale)) * fp8.v_scale;
      }
    }
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(options.head_dim));
    params.window_left = trial % 3 == 1 ? static_cast<int64_t>(rng() % 50) : -1;
    params.softcap = trial % 4 == 3 ? 1.0f + (rng() % 100) / 10.0f : 0.0f;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " heads " << heads.num_q_heads << "/" << heads.num_kv_heads
                 << " d " << options.head_dim << " bs " << options.block_size << " scales "
                 << fp8.k_scale << ", " << fp8.v_scale);
    CheckAgainstReference(c, params, &pool);
    const Result f32 = RunCpuPagedAttention(c, params, nullptr);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Result got;
      got.out.assign(f32.out.size(), 1234.5f);
      got.lse.assign(f32.lse.size(), 1234.5f);
      const absl::Status status =
          PagedAttention(c.q.data(), options.num_q_heads, fp8, options.layer, c.Batch(), params,
                         got.out.data(), got.lse.data(), p);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(got.out == f32.out) << "FP8 pool output differs from the f32 pool of its values";
      EXPECT_TRUE(got.lse == f32.lse) << "FP8 pool lse differs from the f32 pool of its values";
    }
  }
}

TEST(PagedAttentionFp8Test, ScalesMustBeFiniteAndPositive) {
  std::mt19937 rng(TestSeed());
  PagedCase c = MakePagedCase(rng, CaseOptions{}, {{20, 3}});
  std::vector<uint8_t> codes(c.pool.size(), 0x30);
  std::vector<float> out(c.num_tokens * 8 * 64, 1234.5f);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const Fp8KvCacheView fp8{codes.data(), c.layout, 1.0f, bad};
    const absl::Status status = PagedAttention(c.q.data(), 8, fp8, 1, c.Batch(), {.scale = 0.1f},
                                               out.data(), nullptr, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("scales"), std::string::npos) << status;
  }
  EXPECT_EQ(out[0], 1234.5f);  // nothing written
}

TEST(PagedAttentionStabilityTest, LargeScoresDoNotOverflow) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.q_stddev = 40.0f;  // scores with std ~40: exp() would overflow without the max shift
  PagedCase c = MakePagedCase(rng, options, {{300, 1}, {90, 30}});
  const AttentionParams params{1.0f / 8.0f, -1, 0.0f};
  const Reference ref = ReferenceAttention(c, params);
  const Result r = RunCpuPagedAttention(c, params, nullptr);
  // Scores of magnitude ~100 carry fp32 rounding of ~1e-5 absolute, which moves the softmax
  // weights by that much relatively: errors reach ~7e-6 x max|out| here (vs < 1e-6 in the other
  // tests), so this test allows 3e-5.
  EXPECT_TRUE(OutClose(r.out, ref.out, 3e-5));
  // lse ~ hundreds here; fp32 rounding of the max score alone is ~1e-5 absolute.
  EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
}

TEST(PagedAttentionWindowTest, BlocksBeforeTheWindowAreNeverRead) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.block_size = 8;
  PagedCase c = MakePagedCase(rng, options, {{100, 1}, {70, 6}, {40, 40}});
  const AttentionParams params{0.125f, 20, 0.0f};
  const Reference ref = ReferenceAttention(c, params);
  // A sliding-window scheduler frees blocks no query can see; mark them out of range.
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t first_key = std::max<int64_t>(0, c.seqs[s].seq_len - c.seqs[s].q_len - 20);
    for (int64_t b = 0; b < first_key / options.block_size; ++b) {
      c.block_tables[s * c.max_blocks_per_seq + b] = -7;
    }
  }
  const Result r = RunCpuPagedAttention(c, params, nullptr);
  EXPECT_TRUE(OutClose(r.out, ref.out, kOutTol));
  EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
}

// The tests rely on NaN in unowned pool slots to catch stray reads; check that a NaN key
// reaches exactly the outputs that can see it.
TEST(PagedAttentionEdgeTest, NanKeyPoisonsExactlyTheQueriesThatSeeIt) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;  // 8 q heads, 2 kv heads, block_size 16
  PagedCase c = MakePagedCase(rng, options, {{40, 40}});
  const AttentionParams params{0.125f, -1, 0.0f};
  const int64_t poisoned_pos = 21;
  const int64_t slot = int64_t{c.block_tables[poisoned_pos / 16]} * 16 + poisoned_pos % 16;
  // Head 0 (kv head 0) of that slot's K in the attended layer.
  c.pool[c.layout.TileOffset(slot / 16, options.layer, 0) + (slot % 16) * 2 * 64] =
      std::numeric_limits<float>::quiet_NaN();
  const Reference ref = ReferenceAttention(c, params);  // reads the unpoisoned contiguous K
  const Result r = RunCpuPagedAttention(c, params, nullptr);
  for (int64_t pos = 0; pos < 40; ++pos) {
    for (int64_t h = 0; h < 8; ++h) {
      const bool sees_nan = pos >= poisoned_pos && h < 4;  // q heads 0-3 use kv head 0
      const float lse = r.lse[pos * 8 + h];
      for (int64_t d = 0; d < 64; ++d) {
        const float o = r.out[(pos * 8 + h) * 64 + d];
        ASSERT_EQ(std::isnan(o), sees_nan) << "pos " << pos << " head " << h << " dim " << d;
        if (!sees_nan) {
          EXPECT_NEAR(o, ref.out[(pos * 8 + h) * 64 + d], 1e-5);
        }
      }
      EXPECT_EQ(std::isnan(lse), sees_nan) << "pos " << pos << " head " << h;
    }
  }
}

TEST(PagedAttentionEdgeTest, LseIsOptional) {
  std::mt19937 rng(TestSeed());
  PagedCase c = MakePagedCase(rng, CaseOptions{}, {{50, 3}});
  const AttentionParams params{0.125f, -1, 0.0f};
  const Result with_lse = RunCpuPagedAttention(c, params, nullptr);
  std::vector<float> out(with_lse.out.size());
  ASSERT_TRUE(
      PagedAttention(c.q.data(), 8, c.View(), 1, c.Batch(), params, out.data(), nullptr, nullptr)
          .ok());
  EXPECT_TRUE(out == with_lse.out);
}

TEST(PagedAttentionEdgeTest, NoQueriesIsANoOp) {
  std::mt19937 rng(TestSeed());
  PagedCase c = MakePagedCase(rng, CaseOptions{}, {{50, 0}, {0, 0}});
  const AttentionParams params{0.125f, -1, 0.0f};
  float sentinel = 7.0f;
  EXPECT_TRUE(
      PagedAttention(nullptr, 8, c.View(), 1, c.Batch(), params, &sentinel, &sentinel, nullptr)
          .ok());
  EXPECT_EQ(sentinel, 7.0f);
  AttentionBatch empty;
  EXPECT_TRUE(
      PagedAttention(nullptr, 8, c.View(), 1, empty, params, nullptr, nullptr, nullptr).ok());
}

// Each invalid input is rejected with INVALID_ARGUMENT and leaves out/lse untouched.
class PagedAttentionValidationTest : public ::testing::Test {
 protected:
  PagedAttentionValidationTest() : rng_(TestSeed()) {
    CaseOptions options;
    options.block_size = 4;
    c_ = MakePagedCase(rng_, options, {{10, 2}, {5, 5}, {9, 1}});
    out_.assign(c_.num_tokens * 8 * 64, 3.0f);
    lse_.assign(c_.num_tokens * 8, 3.0f);
  }

  absl::Status Call(const AttentionBatch& batch, const AttentionParams& params,
                    int64_t num_q_heads = 8, int64_t layer = 1) {
    return PagedAttention(c_.q.data(), num_q_heads, c_.View(), layer, batch, params, out_.data(),
                          lse_.data(), nullptr);
  }

  void ExpectInvalid(const absl::Status& status, absl::string_view mentions) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(mentions), absl::string_view::npos) << status;
    for (float x : out_) ASSERT_EQ(x, 3.0f) << "out written by a rejected call";
    for (float x : lse_) ASSERT_EQ(x, 3.0f) << "lse written by a rejected call";
  }

  std::mt19937 rng_;
  PagedCase c_;
  std::vector<float> out_, lse_;
  const AttentionParams params_{0.125f, -1, 0.0f};
};

TEST_F(PagedAttentionValidationTest, ValidCaseRuns) { EXPECT_TRUE(Call(c_.Batch(), params_).ok()); }

TEST_F(PagedAttentionValidationTest, HeadsAndLayer) {
  ExpectInvalid(Call(c_.Batch(), params_, /*num_q_heads=*/7), "num_q_heads");
  ExpectInvalid(Call(c_.Batch(), params_, /*num_q_heads=*/0), "num_q_heads");
  ExpectInvalid(Call(c_.Batch(), params_, 8, /*layer=*/2), "layer");
  ExpectInvalid(Call(c_.Batch(), params_, 8, /*layer=*/-1), "layer");
  KvCacheLayout bad = c_.layout;
  bad.num_kv_heads = -2;
  ExpectInvalid(PagedAttention(c_.q.data(), 8, {c_.pool.data(), bad}, 1, c_.Batch(), params_,
                               out_.data(), lse_.data(), nullptr),
                "num_kv_heads");
  ExpectInvalid(PagedAttention(c_.q.data(), 8, KvCacheView{nullptr, c_.layout}, 1, c_.Batch(),
                               params_, out_.data(), lse_.data(), nullptr),
                "cache.data");
}

TEST_F(PagedAttentionValidationTest, Params) {
  ExpectInvalid(Call(c_.Batch(), AttentionParams{}), "scale");  // forgotten scale
  ExpectInvalid(Call(c_.Batch(), {std::numeric_limits<float>::quiet_NaN(), -1, 0.0f}), "scale");
  ExpectInvalid(Call(c_.Batch(), {0.125f, -2, 0.0f}), "window_left");
  ExpectInvalid(Call(c_.Batch(), {0.125f, -1, -1.0f}), "softcap");
  ExpectInvalid(Call(c_.Batch(), {0.125f, -1, std::numeric_limits<float>::infinity()}), "softcap");
}

TEST_F(PagedAttentionValidationTest, QueryStartLoc) {
  c_.query_start_loc = {0, 2, 1, 8};  // decreasing
  ExpectInvalid(Call(c_.Batch(), params_), "decreases");
  c_.query_start_loc = {1, 2, 7, 8};
  ExpectInvalid(Call(c_.Batch(), params_), "query_start_loc[0]");
}

TEST_F(PagedAttentionValidationTest, SeqLens) {
  c_.seq_lens[1] = 4;  // q_len 5 > seq_len 4
  ExpectInvalid(Call(c_.Batch(), params_), "q_len");
  c_.seq_lens[1] = -1;
  ExpectInvalid(Call(c_.Batch(), params_), "negative");
  c_.seq_lens[1] = static_cast<int32_t>(c_.max_blocks_per_seq * 4 + 1);  // beyond the table
  ExpectInvalid(Call(c_.Batch(), params_), "max_blocks_per_seq");
}

TEST_F(PagedAttentionValidationTest, BlockTableEntries) {
  const int32_t saved = c_.block_tables[1];
  c_.block_tables[1] = static_cast<int32_t>(c_.layout.num_blocks);
  ExpectInvalid(Call(c_.Batch(), params_), "block_tables[0][1]");
  c_.block_tables[1] = -1;
  ExpectInvalid(Call(c_.Batch(), params_), "block_tables[0][1]");
  c_.block_tables[1] = saved;
  AttentionBatch batch = c_.Batch();
  batch.block_tables = nullptr;
  ExpectInvalid(Call(batch, params_), "block_tables");
}

TEST_F(PagedAttentionValidationTest, NullPointers) {
  AttentionBatch batch = c_.Batch();
  batch.seq_lens = nullptr;
  ExpectInvalid(Call(batch, params_), "seq_lens");
  ExpectInvalid(PagedAttention(nullptr, 8, c_.View(), 1, c_.Batch(), params_, out_.data(),
                               lse_.data(), nullptr),
                "non-null");
  batch = c_.Batch();
  batch.num_seqs = -1;
  ExpectInvalid(Call(batch, params_), "num_seqs");
  batch = c_.Batch();
  batch.max_blocks_per_seq = -1;
  ExpectInvalid(Call(batch, params_), "max_blocks_per_seq");
}

}  // namespace
}  // namespace tandem::kernels::cpu
