#include "kernels/attention/merge_attn_states.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/paged_attention.h"

namespace tandem::kernels::cpu {
namespace {

using ::tandem::kernels::attention_test::CaseOptions;
using ::tandem::kernels::attention_test::LseClose;
using ::tandem::kernels::attention_test::MakePagedCase;
using ::tandem::kernels::attention_test::OutClose;
using ::tandem::kernels::attention_test::PagedCase;
using ::tandem::kernels::attention_test::RandomNormal;
using ::tandem::kernels::attention_test::Reference;
using ::tandem::kernels::attention_test::ReferenceAttention;
using ::tandem::kernels::attention_test::TestSeed;

// Merged fp32 partials vs fp64 full attention: max |out - ref| <= 1e-5 * max|ref|,
// |lse - ref| <= 1e-5 * max(1, |ref|).
constexpr double kOutTol = 1e-5;
constexpr double kLseTol = 1e-5;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> ToFloat(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// Split-KV decode through the real kernel: each sequence's context is cut at a block boundary;
// part A attends to the first blocks, part B to the rest (its own block table), and the merge
// must equal attention over the whole context.
TEST(MergeAttnStatesTest, SplitKvDecodeThroughPagedAttentionEqualsFull) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int64_t block_size : {1, 16, 32}) {
    CaseOptions options;
    options.num_q_heads = 8;
    options.num_kv_heads = 2;
    options.head_dim = 128;
    options.block_size = block_size;
    options.q_stddev = 2.0f;
    PagedCase c = MakePagedCase(rng, options, {{100, 1}, {257, 1}, {64, 1}, {33, 1}});
    const AttentionParams params{1.0f / std::sqrt(128.0f), -1, 0.0f};

    // Sequence s is split after split_blocks[s] blocks.
    const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
    std::vector<int32_t> lens_a, lens_b;
    std::vector<int32_t> tables_a(c.block_tables.size(), -1), tables_b(c.block_tables.size(), -1);
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t blocks = (c.seqs[s].seq_len + block_size - 1) / block_size;
      const int64_t split = 1 + static_cast<int64_t>(rng() % (blocks - 1));
      lens_a.push_back(static_cast<int32_t>(split * block_size));
      lens_b.push_back(static_cast<int32_t>(c.seqs[s].seq_len - split * block_size));
      const int32_t* table = c.block_tables.data() + s * c.max_blocks_per_seq;
      std::copy(table, table + split, tables_a.begin() + s * c.max_blocks_per_seq);
      std::copy(table + split, table + blocks, tables_b.begin() + s * c.max_blocks_per_seq);
    }
    AttentionBatch batch_a = c.Batch();
    batch_a.seq_lens = lens_a.data();
    batch_a.block_tables = tables_a.data();
    AttentionBatch batch_b = c.Batch();
    batch_b.seq_lens = lens_b.data();
    batch_b.block_tables = tables_b.data();

    const int64_t rows = c.num_tokens * options.num_q_heads;
    std::vector<float> out_a(rows * 128), lse_a(rows), out_b(rows * 128), lse_b(rows);
    ASSERT_TRUE(PagedAttention(c.q.data(), 8, c.View(), options.layer, batch_a, params,
                               out_a.data(), lse_a.data(), nullptr)
                    .ok());
    ASSERT_TRUE(PagedAttention(c.q.data(), 8, c.View(), options.layer, batch_b, params,
                               out_b.data(), lse_b.data(), nullptr)
                    .ok());
    std::vector<float> out(rows * 128), lse(rows);
    MergeAttnStates(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), c.num_tokens, 8, 128,
                    out.data(), lse.data());

    const Reference full = ReferenceAttention(c, params);
    EXPECT_TRUE(OutClose(out, full.out, kOutTol)) << "block_size " << block_size;
    EXPECT_TRUE(LseClose(lse, full.lse, kLseTol)) << "block_size " << block_size;
  }
}

// Chunked prefill / DCP shape: causal queries over a prefix, keys cut at arbitrary points into
// [0, cut) and [cut, end). Queries before the cut see nothing of part B (lse -inf there).
TEST(MergeAttnStatesTest, CausalKeySplitsMergeToFullAttention) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.num_q_heads = 6;
  options.num_kv_heads = 3;
  options.head_dim = 40;
  options.q_stddev = 2.0f;
  PagedCase c = MakePagedCase(rng, options, {{90, 30}, {50, 50}, {20, 1}});
  for (const AttentionParams& params :
       {AttentionParams{0.2f, -1, 0.0f}, AttentionParams{0.2f, 25, 4.0f}}) {
    const Reference full = ReferenceAttention(c, params);
    for (int trial = 0; trial < 5; ++trial) {
      const int64_t cut = static_cast<int64_t>(rng() % 91);
      SCOPED_TRACE(::testing::Message() << "cut=" << cut << " window=" << params.window_left);
      // Partials from the fp64 reference restricted to each key range, rounded to fp32 as a
      // kernel would hand them over.
      const Reference a = ReferenceAttention(c, params, 0, cut);
      const Reference b = ReferenceAttention(c, params, cut);
      std::vector<float> out(full.out.size()), lse(full.lse.size());
      MergeAttnStates(ToFloat(a.out).data(), ToFloat(a.lse).data(), ToFloat(b.out).data(),
                      ToFloat(b.lse).data(), c.num_tokens, 6, 40, out.data(), lse.data());
      EXPECT_TRUE(OutClose(out, full.out, kOutTol));
      EXPECT_TRUE(LseClose(lse, full.lse, kLseTol));
    }
  }
}

// Three disjoint ranges merged as (A + B) + C and A + (B + C), in place.
TEST(MergeAttnStatesTest, MergingIsAssociativeAndInPlace) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.q_stddev = 2.0f;
  PagedCase c = MakePagedCase(rng, options, {{120, 4}, {70, 1}});
  const AttentionParams params{0.125f, -1, 0.0f};
  const Reference full = ReferenceAttention(c, params);
  const Reference a = ReferenceAttention(c, params, 0, 30);
  const Reference b = ReferenceAttention(c, params, 30, 60);
  const Reference cc = ReferenceAttention(c, params, 60);
  const int64_t n = c.num_tokens, h = 8, d = 64;

  std::vector<float> out = ToFloat(a.out), lse = ToFloat(a.lse);  // aliases out_a / lse_a
  MergeAttnStates(out.data(), lse.data(), ToFloat(b.out).data(), ToFloat(b.lse).data(), n, h, d,
                  out.data(), lse.data());
  MergeAttnStates(out.data(), lse.data(), ToFloat(cc.out).data(), ToFloat(cc.lse).data(), n, h, d,
                  out.data(), lse.data());
  EXPECT_TRUE(OutClose(out, full.out, kOutTol));
  EXPECT_TRUE(LseClose(lse, full.lse, kLseTol));

  std::vector<float> out_bc = ToFloat(cc.out), lse_bc = ToFloat(cc.lse);  // aliases out_b
  MergeAttnStates(ToFloat(b.out).data(), ToFloat(b.lse).data(), out_bc.data(), lse_bc.data(), n, h,
                  d, out_bc.data(), lse_bc.data());
  std::vector<float> out2(out.size()), lse2(lse.size());
  MergeAttnStates(ToFloat(a.out).data(), ToFloat(a.lse).data(), out_bc.data(), lse_bc.data(), n, h,
                  d, out2.data(), lse2.data());
  EXPECT_TRUE(OutClose(out2, full.out, kOutTol));
  EXPECT_TRUE(LseClose(lse2, full.lse, kLseTol));
}

// Random rows against the formula evaluated in fp64.
TEST(MergeAttnStatesTest, MatchesFormula) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 9, h = 3, d = 17;
  const std::vector<float> out_a = RandomNormal(rng, n * h * d, 1.0f);
  const std::vector<float> out_b = RandomNormal(rng, n * h * d, 1.0f);
  std::vector<float> lse_a = RandomNormal(rng, n * h, 5.0f);
  std::vector<float> lse_b = RandomNormal(rng, n * h, 5.0f);
  lse_b[0] = lse_a[0] + 150.0f;  // w_a underflows to 0 in fp32
  lse_b[1] = lse_a[1];           // equal weights
  std::vector<float> out(n * h * d), lse(n * h);
  MergeAttnStates(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), n, h, d, out.data(),
                  lse.data());
  std::vector<double> want_out(out.size()), want_lse(lse.size());
  for (int64_t r = 0; r < n * h; ++r) {
    const double m = std::max<double>(lse_a[r], lse_b[r]);
    const double wa = std::exp(lse_a[r] - m), wb = std::exp(lse_b[r] - m);
    for (int64_t j = 0; j < d; ++j) {
      want_out[r * d + j] = (wa * out_a[r * d + j] + wb * out_b[r * d + j]) / (wa + wb);
    }
    want_lse[r] = m + std::log(wa + wb);
  }
  EXPECT_TRUE(OutClose(out, want_out, 1e-6));
  EXPECT_TRUE(LseClose(lse, want_lse, 1e-6));
}

// Edge cases, one row (head_dim 3) each: {lse_a, lse_b} -> which side survives.
TEST(MergeAttnStatesTest, EmptyAndNonFiniteLse) {
  const std::vector<float> out_a = {1.0f, -2.0f, 3.0f};
  const std::vector<float> out_b = {-4.0f, 5.0f, 0.5f};
  const std::vector<float> garbage = {kNaN, kInf, -kInf};
  struct Case {
    float lse_a, lse_b;
    int survivor;  // 0: a, 1: b, -1: neither
  } cases[] = {
      {0.3f, -kInf, 0}, {-kInf, 0.3f, 1},  {-kInf, -kInf, -1}, {kNaN, 2.0f, 1},
      {2.0f, kNaN, 0},  {kNaN, kNaN, -1},  {kInf, 2.0f, 1},    {2.0f, kInf, 0},
      {kInf, kInf, -1}, {kInf, -kInf, -1}, {kNaN, -kInf, -1},  {-kInf, kInf, -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "lse_a=" << c.lse_a << " lse_b=" << c.lse_b);
    // An empty side's out may be garbage; it must not leak into the result.
    const std::vector<float>& in_a = c.survivor == 0 ? out_a : garbage;
    const std::vector<float>& in_b = c.survivor == 1 ? out_b : garbage;
    std::vector<float> out(3, 99.0f);
    float lse = 99.0f;
    MergeAttnStates(in_a.data(), &c.lse_a, in_b.data(), &c.lse_b, 1, 1, 3, out.data(), &lse);
    if (c.survivor == -1) {
      EXPECT_EQ(out, std::vector<float>(3, 0.0f));
      EXPECT_EQ(lse, -kInf);
    } else {
      EXPECT_EQ(out, c.survivor == 0 ? out_a : out_b);  // copied exactly
      EXPECT_EQ(lse, c.survivor == 0 ? c.lse_a : c.lse_b);
    }
  }
}

TEST(MergeAttnStatesTest, AliasingOutputs) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 5, h = 4, d = 33;
  const std::vector<float> out_a = RandomNormal(rng, n * h * d, 1.0f);
  const std::vector<float> out_b = RandomNormal(rng, n * h * d, 1.0f);
  std::vector<float> lse_a = RandomNormal(rng, n * h, 3.0f);
  std::vector<float> lse_b = RandomNormal(rng, n * h, 3.0f);
  lse_a[2] = -kInf;
  lse_b[3] = kNaN;
  std::vector<float> want_out(n * h * d), want_lse(n * h);
  MergeAttnStates(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), n, h, d, want_out.data(),
                  want_lse.data());

  std::vector<float> oa = out_a, la = lse_a;
  MergeAttnStates(oa.data(), la.data(), out_b.data(), lse_b.data(), n, h, d, oa.data(), la.data());
  EXPECT_EQ(oa, want_out);
  EXPECT_EQ(la, want_lse);

  std::vector<float> ob = out_b, lb = lse_b;
  MergeAttnStates(out_a.data(), lse_a.data(), ob.data(), lb.data(), n, h, d, ob.data(), lb.data());
  EXPECT_EQ(ob, want_out);
  EXPECT_EQ(lb, want_lse);
}

// Zero tokens: nothing is read (NaN inputs) and nothing is written (the outputs keep their
// random contents), with real buffers as well as with null pointers.
TEST(MergeAttnStatesTest, ZeroRowsIsANoOp) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t h = 8, d = 64;
  const std::vector<float> in_out(h * d, kNaN), in_lse(h, kNaN);
  const std::vector<float> before_out = RandomNormal(rng, h * d, 1.0f);
  const std::vector<float> before_lse = RandomNormal(rng, h, 5.0f);
  std::vector<float> out = before_out, lse = before_lse;
  MergeAttnStates(in_out.data(), in_lse.data(), in_out.data(), in_lse.data(), 0, h, d, out.data(),
                  lse.data());
  EXPECT_EQ(out, before_out);
  EXPECT_EQ(lse, before_lse);
  MergeAttnStates(nullptr, nullptr, nullptr, nullptr, 0, h, d, nullptr, nullptr);  // no access
}

// ---- N-way merge ----

// N partials in a strided stack with NaN gaps between them (the gaps must never be read); each
// row gets a random set of empty partials (lse -inf, NaN or +inf, out NaN), some rows all empty.
TEST(MergeAttnStatesNTest, MatchesFormulaWithEmptyPartials) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int64_t parts : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(::testing::Message() << parts << " partials");
    const int64_t n = 7, h = 3, d = 19, rows = n * h;
    const int64_t out_stride = rows * d + 11, lse_stride = rows + 5;
    std::vector<float> outs(parts * out_stride, kNaN), lses(parts * lse_stride, kNaN);
    for (int64_t i = 0; i < parts; ++i) {
      const std::vector<float> o = RandomNormal(rng, rows * d, 1.0f);
      const std::vector<float> l = RandomNormal(rng, rows, 5.0f);
      std::copy(o.begin(), o.end(), outs.begin() + i * out_stride);
      std::copy(l.begin(), l.end(), lses.begin() + i * lse_stride);
    }
    if (parts > 1) lses[lse_stride + 2] = lses[2] + 150.0f;  // row 2: partial 0's weight underflows
    const float empties[] = {-kInf, kNaN, kInf};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < parts; ++i) {
        // Row 0: all empty; row 1: only partial 0 non-empty; row 2: none empty; others: random.
        const bool empty = r == 0 || (r == 1 && i > 0) || (r > 2 && rng() % 3 == 0);
        if (!empty) continue;
        lses[i * lse_stride + r] = empties[rng() % 3];
        outs[i * out_stride + r * d + rng() % d] = kNaN;
      }
    }
    const AttnPartials<float> view{outs.data(), out_stride, lses.data(), lse_stride, parts};
    std::vector<float> out(rows * d, 99.0f), lse(rows, 99.0f);
    MergeAttnStatesN(view, n, h, d, out.data(), lse.data());

    std::vector<double> want_out(rows * d, 0.0), want_lse(rows);
    for (int64_t r = 0; r < rows; ++r) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < parts; ++i) {
        const float l = lses[i * lse_stride + r];
        if (std::isfinite(l)) m = std::max<double>(m, l);
      }
      if (std::isinf(m)) {
        want_lse[r] = m;
        continue;
      }
      double sum = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const float l = lses[i * lse_stride + r];
        if (!std::isfinite(l)) continue;
        const double w = std::exp(l - m);
        sum += w;
        for (int64_t j = 0; j < d; ++j) want_out[r * d + j] += w * outs[i * out_stride + r * d + j];
      }
      for (int64_t j = 0; j < d; ++j) want_out[r * d + j] /= sum;
      want_lse[r] = m + std::log(sum);
    }
    EXPECT_TRUE(OutClose(out, want_out, 1e-6));
    EXPECT_TRUE(LseClose(lse, want_lse, 1e-6));
    // All empty: exactly 0 / -inf. One non-empty: an exact copy.
    EXPECT_EQ(lse[0], -kInf);
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out[j], 0.0f);
    EXPECT_EQ(lse[1], lses[1]);
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out[d + j], outs[d + j]);
    // lse is optional and does not change out.
    std::vector<float> out_no_lse(rows * d);
    MergeAttnStatesN(view, n, h, d, out_no_lse.data(), nullptr);
    EXPECT_EQ(out_no_lse, out);
  }
}

// Real attention partials: keys cut into N ranges (some empty for early queries) merge to full
// attention, and N = 2 agrees with the two-way merge.
TEST(MergeAttnStatesNTest, KeyRangesMergeToFullAttention) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  CaseOptions options;
  options.num_q_heads = 6;
  options.num_kv_heads = 3;
  options.head_dim = 40;
  options.q_stddev = 2.0f;
  PagedCase c = MakePagedCase(rng, options, {{90, 30}, {50, 50}, {20, 1}});
  const AttentionParams params{0.2f, 25, 0.0f};
  const Reference full = ReferenceAttention(c, params);
  const int64_t rows = c.num_tokens * 6, elems = rows * 40;
  for (int64_t parts : {2, 4, 6}) {
    std::vector<int64_t> cuts = {0};
    for (int64_t i = 1; i < parts; ++i) cuts.push_back(static_cast<int64_t>(rng() % 91));
    std::sort(cuts.begin(), cuts.end());
    cuts.push_back(std::numeric_limits<int64_t>::max());
    std::vector<float> outs, lses;
    for (int64_t i = 0; i < parts; ++i) {
      const Reference p = ReferenceAttention(c, params, cuts[i], cuts[i + 1]);
      outs.insert(outs.end(), p.out.begin(), p.out.end());
      lses.insert(lses.end(), p.lse.begin(), p.lse.end());
    }
    std::vector<float> out(elems), lse(rows);
    MergeAttnStatesN({outs.data(), elems, lses.data(), rows, parts}, c.num_tokens, 6, 40,
                     out.data(), lse.data());
    EXPECT_TRUE(OutClose(out, full.out, kOutTol)) << parts << " partials";
    EXPECT_TRUE(LseClose(lse, full.lse, kLseTol)) << parts << " partials";
    if (parts != 2) continue;
    std::vector<float> out2(elems), lse2(rows);
    MergeAttnStates(outs.data(), lses.data(), outs.data() + elems, lses.data() + rows, c.num_tokens,
                    6, 40, out2.data(), lse2.data());
    EXPECT_TRUE(OutClose(out, std::vector<double>(out2.begin(), out2.end()), 1e-6));
    EXPECT_TRUE(LseClose(lse, std::vector<double>(lse2.begin(), lse2.end()), 1e-6));
  }
}

TEST(MergeAttnStatesNTest, ZeroRowsAndZeroPartials) {
  MergeAttnStatesN({}, 0, 8, 64, nullptr, nullptr);
  std::vector<float> out(2 * 3, 5.0f), lse(2, 5.0f);
  MergeAttnStatesN({}, 1, 2, 3, out.data(), lse.data());  // no partials: every row empty
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -kInf);
}

}  // namespace
}  // namespace tandem::kernels::cpu
