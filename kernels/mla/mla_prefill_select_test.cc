// The CUDA MLA form choice (mla_prefill_select.h): the pair count it estimates, its rule on
// decode and speculative verification, and its cost model against the 32 prefill shapes measured
// on an H200 (BENCHMARKS.md "Prefill: absorbed vs unabsorbed").
#include "kernels/mla/mla_prefill_select.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

TEST(MlaPrefillSelectTest, VisiblePairsOfOneRequestAreExact) {
  // q new tokens over a prefix p: token i sees p + i + 1 keys.
  for (int64_t p : {0, 7, 1000}) {
    for (int64_t q : {1, 2, 63, 512}) {
      double want = 0;
      for (int64_t i = 0; i < q; ++i) want += static_cast<double>(p + i + 1);
      EXPECT_DOUBLE_EQ(
          MlaVisiblePairs({.num_heads = 16, .num_seqs = 1, .num_tokens = q, .max_seq_len = p + q}),
          want);
    }
  }
  EXPECT_EQ(MlaVisiblePairs({.num_heads = 16, .num_seqs = 0, .num_tokens = 0, .max_seq_len = 9}),
            0.0);
  EXPECT_EQ(MlaUnabsorbedContextRows(
                {.num_heads = 16, .num_seqs = 3, .num_tokens = 7, .max_seq_len = 100}),
            300);
}

TEST(MlaPrefillSelectTest, CostModelTermsAndTheDecodeGuard) {
  MlaFormCosts c{.absorbed_per_triple = 2.0, .unabsorbed_per_triple = 1.0};
  // 1 head, one request of 64 tokens over 1000: one 64-row item, 396 slots.
  const MlaStepBounds b{.num_heads = 1, .num_seqs = 1, .num_tokens = 64, .max_seq_len = 1064};
  const double tri = MlaVisiblePairs(b);
  EXPECT_DOUBLE_EQ(MlaAbsorbedNs(b, c), 2.0 * tri);
  EXPECT_DOUBLE_EQ(MlaUnabsorbedNs(b, c), 396.0 * tri);  // one item: no parallelism
  EXPECT_FALSE(PreferUnabsorbedMla(b, c));
  c.unabsorbed_ctas_per_sm = 0;  // one slot at least
  EXPECT_DOUBLE_EQ(MlaUnabsorbedNs(b, c), tri);
  EXPECT_TRUE(PreferUnabsorbedMla(b, c));
  c.unabsorbed_per_triple_reads = 3.0;  // x Hq / min(items, slots) = 1
  EXPECT_DOUBLE_EQ(MlaUnabsorbedNs(b, c), 4.0 * tri);
  EXPECT_FALSE(PreferUnabsorbedMla(b, c));
  c.unabsorbed_per_triple_reads = 0.0;
  c.absorbed_fixed = 5.0;
  c.absorbed_per_token_head = 1.0;
  EXPECT_DOUBLE_EQ(MlaAbsorbedNs(b, c), 2.0 * tri + 64.0 + 5.0);
  // However cheap the unabsorbed form, <= kMlaAbsorbMaxQueryLen tokens per request stay absorbed.
  for (int64_t seqs : {1, 64}) {
    for (int64_t q : {1, 4}) {
      EXPECT_FALSE(PreferUnabsorbedMla(
          {.num_heads = 1, .num_seqs = seqs, .num_tokens = seqs * q, .max_seq_len = 4096}, c));
    }
  }
  EXPECT_TRUE(PreferUnabsorbedMla(
      {.num_heads = 1, .num_seqs = 64, .num_tokens = 64 * 5, .max_seq_len = 4096}, c));
  EXPECT_FALSE(PreferUnabsorbedMla({.num_heads = 16, .num_seqs = 0, .num_tokens = 0}, c));
}

struct Cell {
  int64_t heads, prefix, chunk;
  double absorbed_us, unabsorbed_us;  // measured (BENCHMARKS.md)
};

// mla_prefill_cuda_bench on nvidia-h200, one request, page 64, bf16 (both grids of the call).
const Cell kMeasured[] = {
    {16, 0, 512, 50.1, 53.4},          {16, 1024, 512, 86.1, 123.5},
    {16, 4096, 512, 196.5, 382.1},     {16, 16384, 512, 632.0, 1451.4},
    {16, 0, 2048, 271.9, 193.2},       {16, 1024, 2048, 415.7, 350.2},
    {16, 4096, 2048, 848.7, 837.0},    {16, 16384, 2048, 2577.0, 2909.6},
    {128, 0, 512, 251.0, 164.6},       {128, 1024, 512, 542.5, 606.0},
    {128, 4096, 512, 1407.0, 1919.9},  {128, 16384, 512, 4828.1, 7669.9},
    {128, 0, 2048, 1743.6, 1753.4},    {128, 1024, 2048, 2898.8, 3253.0},
    {128, 4096, 2048, 6311.5, 8316.7}, {128, 16384, 2048, 21334.9, 29681.1},
    {16, 0, 64, 33.9, 30.8},           {16, 4096, 64, 56.5, 395.0},
    {16, 0, 128, 35.5, 30.2},          {16, 4096, 128, 80.2, 383.1},
    {16, 0, 256, 34.0, 37.2},          {16, 4096, 256, 124.2, 384.7},
    {16, 0, 1024, 108.5, 87.7},        {16, 4096, 1024, 396.4, 418.5},
    {128, 0, 64, 48.2, 29.0},          {128, 4096, 64, 194.1, 580.2},
    {128, 0, 128, 74.9, 43.6},         {128, 4096, 128, 366.8, 605.2},
    {128, 0, 256, 134.8, 69.5},        {128, 4096, 256, 714.1, 915.6},
    {128, 0, 1024, 613.7, 530.6},      {128, 4096, 1024, 2912.5, 3805.7},
};

TEST(MlaPrefillSelectTest, MeasuredCostsPickTheMeasuredWinner) {
  int checked = 0;
  for (const Cell& m : kMeasured) {
    const MlaStepBounds b{.num_heads = m.heads,
                          .num_seqs = 1,
                          .num_tokens = m.chunk,
                          .max_seq_len = m.prefix + m.chunk};
    const MlaFormCosts c = MeasuredMlaFormCosts();
    const double abs_us = MlaAbsorbedNs(b, c) / 1e3, un_us = MlaUnabsorbedNs(b, c) / 1e3;
    // Each form's estimate within 30% of its measured time.
    EXPECT_NEAR(abs_us / m.absorbed_us, 1.0, 0.3) << m.heads << "/" << m.prefix << "/" << m.chunk;
    EXPECT_NEAR(un_us / m.unabsorbed_us, 1.0, 0.3) << m.heads << "/" << m.prefix << "/" << m.chunk;
    // The faster form wherever the measured margin exceeds 15% (23 of the 32 cells; the other
    // 9 are near-ties, 0.91-1.13, which the model may call either way).
    const double ratio = m.unabsorbed_us / m.absorbed_us;
    if (std::abs(std::log(ratio)) < std::log(1.15)) continue;
    ++checked;
    EXPECT_EQ(PreferUnabsorbedMla(b), ratio < 1.0)
        << m.heads << " heads, prefix " << m.prefix << ", chunk " << m.chunk << ": measured "
        << ratio << ", estimated " << un_us / abs_us;
  }
  EXPECT_EQ(checked, 23);
  // Decode and verification at the benchmark's head counts and long contexts: absorbed.
  for (int64_t heads : {16, 128}) {
    for (int64_t ctx : {1, 100, 4096, 65536}) {
      EXPECT_FALSE(PreferUnabsorbedMla(
          {.num_heads = heads, .num_seqs = 64, .num_tokens = 64 * 4, .max_seq_len = ctx}));
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
