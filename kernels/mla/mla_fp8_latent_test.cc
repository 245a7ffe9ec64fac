// FP8 latent KV (mla_fp8_latent.h): the row quantizer against e4m3's precision, and attention over
// an FP8 pool against an fp64 reference over the dequantized latents and against the fp32 pool,
// on random inputs and shuffled block tables.
#include "kernels/mla/mla_fp8_latent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

std::vector<float> Random(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(MlaFp8LatentTest, RowsRoundTripWithinE4m3Precision) {
  std::mt19937 rng(7);
  const int64_t n = 576;
  for (float stddev : {1e-3f, 0.5f, 30.0f}) {
    std::vector<float> x = Random(rng, n, stddev);
    x[17] = 40.0f * stddev;  // an outlier sets the scale
    std::vector<uint8_t> codes(n);
    const float scale = cpu::QuantizeLatentRowFp8(x.data(), n, codes.data());
    EXPECT_FLOAT_EQ(scale, 40.0f * stddev / 448.0f);
    std::vector<float> back(n);
    cpu::DequantizeLatentRowFp8(codes.data(), scale, n, back.data());
    EXPECT_NEAR(back[17], x[17], 1e-6 * x[17]);  // the largest value maps to 448 exactly
    for (int64_t i = 0; i < n; ++i) {
      // Half a step: 2^-4 relative for normals, 2^-10 * scale among e4m3's subnormals.
      const double bound = std::fabs(double{x[i]}) / 16.0 + double{scale} / 1024.0;
      ASSERT_LE(std::fabs(double{back[i]} - x[i]), bound * (1 + 1e-6)) << i << " at " << stddev;
    }
  }
  std::vector<float> zero(n, 0.0f);
  std::vector<uint8_t> codes(n, 0xAB);
  EXPECT_EQ(cpu::QuantizeLatentRowFp8(zero.data(), n, codes.data()), 1.0f);
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0; }));
}

// One layer-1 latent pool in fp32 and FP8 (the same random rows written through both), a batch of
// sequences over shuffled blocks, and fp64 MLA from the definition over the FP8 pool's dequantized
// rows.
TEST(MlaFp8LatentTest, AttentionMatchesFp64OverTheDequantizedLatents) {
  std::mt19937 rng(11);
  const MlaDims d{4, 16, 8, 32, 16};
  const int64_t Hq = d.num_heads, Dn = d.qk_nope_head_dim, Dr = d.qk_rope_head_dim;
  const int64_t L = d.kv_lora_rank, Dv = d.v_head_dim, Dqk = d.QkHeadDim(), W = d.LatentDim();
  const std::vector<int32_t> q_lens = {1, 3, 1}, seq_lens = {37, 20, 5};
  const int64_t S = 3, bs = 4, max_blocks = 10;
  KvCacheLayout layout{.num_blocks = S * max_blocks + 2,
                       .num_layers = 2,
                       .block_size = bs,
                       .num_kv_heads = 1,
                       .head_dim = W,
                       .num_planes = 1};
  std::vector<float> pool(layout.TotalElems(), 0.0f);
  std::vector<uint8_t> codes(layout.TotalElems(), 0);
  std::vector<float> scales(layout.TotalElems() / W, 0.0f);
  const cpu::Fp8LatentCacheView fp8{codes.data(), scales.data(), layout};
  std::vector<int32_t> ids(layout.num_blocks), tables(S * max_blocks, -1), qsl = {0};
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int64_t s = 0, next = 0; s < S; ++s) {
    std::vector<int64_t> slots(seq_lens[s]);
    for (int64_t j = 0; j < seq_lens[s]; ++j) {
      if (j % bs == 0) tables[s * max_blocks + j / bs] = ids[next++];
      slots[j] = int64_t{tables[s * max_blocks + j / bs]} * bs + j % bs;
    }
    const std::vector<float> latent = Random(rng, seq_lens[s] * W, 1.0f);
    ASSERT_TRUE(
        cpu::WriteLatentCache(latent.data(), slots.data(), seq_lens[s], 1, {pool.data(), layout})
            .ok());
    ASSERT_TRUE(cpu::WriteLatentCacheFp8(latent.data(), slots.data(), seq_lens[s], 1, fp8).ok());
    qsl.push_back(qsl.back() + q_lens[s]);
  }
  const int64_t T = qsl.back();
  const std::vector<float> q = Random(rng, T * Hq * Dqk, 1.0f);
  const std::vector<float> kv_b = Random(rng, Hq * (Dn + Dv) * L, 0.3f);
  AttentionBatch batch;
  batch.query_start_loc = qsl.data();
  batch.seq_lens = seq_lens.data();
  batch.block_tables = tables.data();
  batch.num_seqs = S;
  batch.max_blocks_per_seq = max_blocks;
  const float scale = 0.17f;
  std::vector<float> deq;
  cpu::DequantizeLatentCacheFp8(fp8, &deq);
  std::vector<double> want(T * Hq * Dv, 0.0), want_lse(T * Hq);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t i = 0; i < q_lens[s]; ++i) {
      const int64_t t = qsl[s] + i, visible = seq_lens[s] - q_lens[s] + i + 1;
      for (int64_t h = 0; h < Hq; ++h) {
        std::vector<double> sc(visible), v(visible * Dv, 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          const float* lat =
              deq.data() + layout.TileOffset(tables[s * max_blocks + j / bs], 1, 0) + (j % bs) * W;
          double dot = 0;
          for (int64_t n = 0; n < Dn; ++n) {
            double k = 0;
            for (int64_t c = 0; c < L; ++c) k += double{kv_b[(h * (Dn + Dv) + n) * L + c]} * lat[c];
            dot += double{q[(t * Hq + h) * Dqk + n]} * k;
          }
          for (int64_t r = 0; r < Dr; ++r)
            dot += double{q[(t * Hq + h) * Dqk + Dn + r]} * lat[L + r];
          sc[j] = dot * scale;
          for (int64_t e = 0; e < Dv; ++e) {
            for (int64_t c = 0; c < L; ++c) {
              v[j * Dv + e] += double{kv_b[(h * (Dn + Dv) + Dn + e) * L + c]} * lat[c];
            }
          }
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double x : sc) sum += std::exp(x - m);
        for (int64_t j = 0; j < visible; ++j) {
          for (int64_t e = 0; e < Dv; ++e) {
            want[(t * Hq + h) * Dv + e] += std::exp(sc[j] - m) / sum * v[j * Dv + e];
          }
        }
        want_lse[t * Hq + h] = m + std::log(sum);
      }
    }
  }
  double max_ref = 0;
  for (double x : want) max_ref = std::max(max_ref, std::fabs(x));
  ASSERT_GT(max_ref, 0.0);
  for (MlaMode mode : {MlaMode::kAbsorbed, MlaMode::kUnabsorbed}) {
    std::vector<float> out(T * Hq * Dv), lse(T * Hq), out32(T * Hq * Dv);
    ASSERT_TRUE(cpu::MlaPagedAttentionFp8(q.data(), kv_b.data(), d, fp8, 1, batch, scale, mode,
                                          out.data(), lse.data(), nullptr)
                    .ok());
    ASSERT_TRUE(cpu::MlaPagedAttention(q.data(), kv_b.data(), d, {pool.data(), layout}, 1, batch,
                                       scale, mode, out32.data(), nullptr, nullptr)
                    .ok());
    double worst = 0, worst_lse = 0, vs32 = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      worst = std::max(worst, std::fabs(out[i] - want[i]));
      vs32 = std::max(vs32, std::fabs(double{out[i]} - out32[i]));
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      worst_lse = std::max(worst_lse, std::fabs(lse[i] - want_lse[i]));
    }
    EXPECT_LE(worst, 1e-4 * max_ref) << static_cast<int>(mode);
    EXPECT_LE(worst_lse, 1e-4 * (1 + std::fabs(want_lse[0]))) << static_cast<int>(mode);
    // e4m3 latents against fp32 latents: within a few per cent of the output's range, not equal.
    EXPECT_LE(vs32, 0.08 * max_ref) << static_cast<int>(mode);
    EXPECT_GT(vs32, 0.0) << static_cast<int>(mode);
  }
}

// The block-interleaved pool (block_bytes > 0: each block its codes then its scales, one range)
// holds, block for block, the planar pool's bytes, and attention over it is bit-identical.
TEST(MlaFp8LatentTest, BlockInterleavedPoolHoldsThePlanarBlocks) {
  std::mt19937 rng(23);
  const MlaDims d{2, 8, 8, 16, 8};
  const int64_t W = d.LatentDim(), bs = 4, T = 11;
  const KvCacheLayout layout{.num_blocks = 5,
                             .num_layers = 3,
                             .block_size = bs,
                             .num_kv_heads = 1,
                             .head_dim = W,
                             .num_planes = 1};
  const int64_t codes_per_block = layout.BlockElems(), rows = codes_per_block / W;
  std::vector<uint8_t> codes(layout.TotalElems(), 0);
  std::vector<float> scales(layout.TotalElems() / W, 0.0f);
  const cpu::Fp8LatentCacheView planar{codes.data(), scales.data(), layout};
  const int64_t block_bytes = codes_per_block + rows * 4;
  std::vector<float> words(layout.num_blocks * block_bytes / 4, 0.0f);
  auto* base = reinterpret_cast<uint8_t*>(words.data());
  const cpu::Fp8LatentCacheView inter{base, reinterpret_cast<float*>(base + codes_per_block),
                                      layout, block_bytes};
  const std::vector<int32_t> table = {3, 0, 4};  // 11 tokens over three shuffled blocks
  std::vector<int64_t> slots(T);
  for (int64_t j = 0; j < T; ++j) slots[j] = int64_t{table[j / bs]} * bs + j % bs;
  for (int64_t layer = 0; layer < layout.num_layers; ++layer) {
    const std::vector<float> latent = Random(rng, T * W, 1.0f);
    ASSERT_TRUE(cpu::WriteLatentCacheFp8(latent.data(), slots.data(), T, layer, planar).ok());
    ASSERT_TRUE(cpu::WriteLatentCacheFp8(latent.data(), slots.data(), T, layer, inter).ok());
  }
  for (int32_t b : table) {
    EXPECT_TRUE(std::equal(codes.begin() + b * codes_per_block,
                           codes.begin() + (b + 1) * codes_per_block, base + b * block_bytes));
    EXPECT_EQ(
        std::memcmp(scales.data() + b * rows, base + b * block_bytes + codes_per_block, rows * 4),
        0);
  }
  std::vector<float> deq_planar, deq_inter;
  cpu::DequantizeLatentCacheFp8(planar, &deq_planar);
  cpu::DequantizeLatentCacheFp8(inter, &deq_inter);
  EXPECT_EQ(deq_planar, deq_inter);
  const std::vector<int32_t> q_lens = {2}, seq_lens = {T}, qsl = {0, 2};
  AttentionBatch batch;
  batch.query_start_loc = qsl.data();
  batch.seq_lens = seq_lens.data();
  batch.block_tables = table.data();
  batch.num_seqs = 1;
  batch.max_blocks_per_seq = 3;
  const std::vector<float> q = Random(rng, 2 * d.num_heads * d.QkHeadDim(), 1.0f);
  const std::vector<float> kv_b =
      Random(rng, d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank, 0.3f);
  std::vector<float> out_p(2 * d.num_heads * d.v_head_dim), out_i(out_p.size());
  std::vector<float> lse_p(2 * d.num_heads), lse_i(lse_p.size());
  ASSERT_TRUE(cpu::MlaPagedAttentionFp8(q.data(), kv_b.data(), d, planar, 2, batch, 0.2f,
                                        MlaMode::kAbsorbed, out_p.data(), lse_p.data(), nullptr)
                  .ok());
  ASSERT_TRUE(cpu::MlaPagedAttentionFp8(q.data(), kv_b.data(), d, inter, 2, batch, 0.2f,
                                        MlaMode::kAbsorbed, out_i.data(), lse_i.data(), nullptr)
                  .ok());
  EXPECT_EQ(out_p, out_i);
  EXPECT_EQ(lse_p, lse_i);
  // A block_bytes that cannot hold a block's codes and scales is refused.
  cpu::Fp8LatentCacheView small = inter;
  small.block_bytes = block_bytes - 4;
  EXPECT_EQ(cpu::WriteLatentCacheFp8(q.data(), slots.data(), 1, 0, small).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlaFp8LatentTest, RefusesWhatIsNotAnFp8LatentCache) {
  KvCacheLayout layout{.num_blocks = 2,
                       .num_layers = 1,
                       .block_size = 4,
                       .num_kv_heads = 1,
                       .head_dim = 40,
                       .num_planes = 1};
  std::vector<uint8_t> codes(layout.TotalElems());
  std::vector<float> scales(layout.TotalElems() / 40), row(40, 1.0f);
  const int64_t bad_slot = 8, good_slot = 3;
  EXPECT_FALSE(
      cpu::WriteLatentCacheFp8(row.data(), &bad_slot, 1, 0, {codes.data(), scales.data(), layout})
          .ok());
  EXPECT_FALSE(
      cpu::WriteLatentCacheFp8(row.data(), &good_slot, 1, 0, {codes.data(), nullptr, layout}).ok());
  layout.num_planes = 2;  // a K/V cache, not a latent one
  EXPECT_FALSE(
      cpu::WriteLatentCacheFp8(row.data(), &good_slot, 1, 0, {codes.data(), scales.data(), layout})
          .ok());
}

}  // namespace
}  // namespace tandem::kernels
