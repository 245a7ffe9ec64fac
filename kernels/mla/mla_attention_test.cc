// MLA kernels against an fp64 reference written from the definition (per-head k_nope / v
// up-projected from the latent, causal softmax), on random inputs and scattered block tables.
#include "kernels/mla/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/merge_attn_states.h"

namespace tandem::kernels {
namespace {

std::vector<float> Random(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  MlaDims dims;
  std::vector<int32_t> q_lens, seq_lens;
};

struct Fixture {
  KvCacheLayout layout;
  std::vector<float> pool, q, kv_b;
  std::vector<int32_t> query_start_loc, seq_lens, block_tables;
  int64_t max_blocks = 0;
  AttentionBatch batch;
};

// Random latents for every context token, written through WriteLatentCache into blocks dealt
// out in a shuffled order.
Fixture Build(const Case& c, std::mt19937& rng) {
  Fixture f;
  const MlaDims& d = c.dims;
  f.layout.block_size = 4;
  f.layout.num_layers = 2;
  f.layout.num_kv_heads = 1;
  f.layout.num_planes = 1;
  f.layout.head_dim = d.LatentDim();
  const int64_t S = static_cast<int64_t>(c.seq_lens.size());
  for (int32_t len : c.seq_lens) {
    f.max_blocks = std::max<int64_t>(f.max_blocks, (len + 3) / 4);
  }
  f.layout.num_blocks = S * f.max_blocks + 3;
  f.pool.assign(f.layout.TotalElems(), 0.0f);
  std::vector<int32_t> ids(f.layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  f.block_tables.assign(S * f.max_blocks, -1);
  f.query_start_loc = {0};
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < (c.seq_lens[s] + 3) / 4; ++b) {
      f.block_tables[s * f.max_blocks + b] = ids[next++];
    }
    std::vector<int64_t> slots(c.seq_lens[s]);
    for (int64_t j = 0; j < c.seq_lens[s]; ++j) {
      slots[j] = int64_t{f.block_tables[s * f.max_blocks + j / 4]} * 4 + j % 4;
    }
    const std::vector<float> latent = Random(rng, c.seq_lens[s] * d.LatentDim(), 1.0f);
    EXPECT_TRUE(cpu::WriteLatentCache(latent.data(), slots.data(), c.seq_lens[s], /*layer=*/1,
                                      {f.pool.data(), f.layout})
                    .ok());
    f.query_start_loc.push_back(f.query_start_loc.back() + c.q_lens[s]);
  }
  f.seq_lens = c.seq_lens;
  const int64_t T = f.query_start_loc.back();
  f.q = Random(rng, T * d.num_heads * d.QkHeadDim(), 1.0f);
  f.kv_b = Random(rng, d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank, 0.3f);
  f.batch.query_start_loc = f.query_start_loc.data();
  f.batch.seq_lens = f.seq_lens.data();
  f.batch.block_tables = f.block_tables.data();
  f.batch.num_seqs = S;
  f.batch.max_blocks_per_seq = f.max_blocks;
  return f;
}

// fp64 MLA from the definition: k_nope / v per head up-projected from c_kv, causal softmax.
void Reference(const Fixture& f, const MlaDims& d, double scale, std::vector<double>* out,
               std::vector<double>* lse) {
  const int64_t Hq = d.num_heads, Dn = d.qk_nope_head_dim, Dr = d.qk_rope_head_dim;
  const int64_t L = d.kv_lora_rank, Dv = d.v_head_dim, Dqk = d.QkHeadDim();
  const int64_t T = f.query_start_loc.back();
  out->assign(T * Hq * Dv, 0.0);
  lse->assign(T * Hq, 0.0);
  for (int64_t s = 0; s < f.batch.num_seqs; ++s) {
    const int64_t q0 = f.query_start_loc[s], q_len = f.query_start_loc[s + 1] - q0;
    const int64_t ctx = f.seq_lens[s];
    auto latent = [&](int64_t j) {
      const int64_t block = f.block_tables[s * f.max_blocks + j / 4];
      return f.pool.data() + f.layout.TileOffset(block, 1, 0) + (j % 4) * d.LatentDim();
    };
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* q = f.q.data() + ((q0 + i) * Hq + h) * Dqk;
        const int64_t visible = ctx - q_len + i + 1;
        std::vector<double> score(visible);
        std::vector<std::vector<double>> v(visible, std::vector<double>(Dv));
        for (int64_t j = 0; j < visible; ++j) {
          const float* lat = latent(j);
          double sc = 0;
          for (int64_t n = 0; n < Dn; ++n) {
            double k = 0;
            for (int64_t c = 0; c < L; ++c)
              k += double{f.kv_b[(h * (Dn + Dv) + n) * L + c]} * lat[c];
            sc += double{q[n]} * k;
          }
          for (int64_t r = 0; r < Dr; ++r) sc += double{q[Dn + r]} * lat[L + r];
          score[j] = sc * scale;
          for (int64_t e = 0; e < Dv; ++e) {
            double x = 0;
            for (int64_t c = 0; c < L; ++c) {
              x += double{f.kv_b[(h * (Dn + Dv) + Dn + e) * L + c]} * lat[c];
            }
            v[j][e] = x;
          }
        }
        const double m = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double x : score) sum += std::exp(x - m);
        for (int64_t j = 0; j < visible; ++j) {
          const double p = std::exp(score[j] - m) / sum;
          for (int64_t e = 0; e < Dv; ++e) (*out)[((q0 + i) * Hq + h) * Dv + e] += p * v[j][e];
        }
        (*lse)[(q0 + i) * Hq + h] = m + std::log(sum);
      }
    }
  }
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double rel,
                const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0, worst = 0;
  for (double x : want) max_ref = std::max(max_ref, std::fabs(x));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_GT(max_ref, 0.0) << what;
  EXPECT_LE(worst, rel * max_ref) << what << ": max |diff| " << worst << " of max " << max_ref;
}

class MlaAttentionTest : public ::testing::TestWithParam<MlaMode> {};

TEST_P(MlaAttentionTest, MatchesFp64ReferenceOnRandomPagedBatches) {
  std::mt19937 rng(20261128);
  const std::vector<Case> cases = {
      // decode q_len 1..4 (speculative verification) and prefill / chunked prefill
      {{3, 8, 4, 16, 6}, {1, 2, 3, 4}, {9, 5, 13, 4}},
      {{2, 16, 8, 32, 16}, {11, 1, 6}, {11, 17, 30}},
      {{4, 4, 2, 8, 4}, {1}, {1}},
  };
  for (const Case& c : cases) {
    Fixture f = Build(c, rng);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dims.QkHeadDim())) * 1.3;
    std::vector<double> want_out, want_lse;
    Reference(f, c.dims, scale, &want_out, &want_lse);
    const int64_t T = f.query_start_loc.back();
    std::vector<float> out(T * c.dims.num_heads * c.dims.v_head_dim, -1.0f);
    std::vector<float> lse(T * c.dims.num_heads, -1.0f);
    ThreadPool pool(2);
    ASSERT_TRUE(cpu::MlaPagedAttention(f.q.data(), f.kv_b.data(), c.dims, {f.pool.data(), f.layout},
                                       /*layer=*/1, f.batch, static_cast<float>(scale), GetParam(),
                                       out.data(), lse.data(), &pool)
                    .ok());
    ExpectNear(out, want_out, 2e-5, "out");
    ExpectNear(lse, want_lse, 2e-5, "lse");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, MlaAttentionTest,
                         ::testing::Values(MlaMode::kAbsorbed, MlaMode::kUnabsorbed,
                                           MlaMode::kAuto));

TEST(MlaAttentionTest, AbsorbedEqualsUnabsorbed) {
  std::mt19937 rng(7);
  const Case c{{4, 12, 6, 24, 10}, {3, 1, 8}, {20, 7, 8}};
  Fixture f = Build(c, rng);
  const int64_t n = f.query_start_loc.back() * c.dims.num_heads * c.dims.v_head_dim;
  std::vector<float> a(n), u(n);
  for (auto [mode, out] :
       {std::pair{MlaMode::kAbsorbed, &a}, std::pair{MlaMode::kUnabsorbed, &u}}) {
    ASSERT_TRUE(cpu::MlaPagedAttention(f.q.data(), f.kv_b.data(), c.dims, {f.pool.data(), f.layout},
                                       1, f.batch, 0.25f, mode, out->data(), nullptr, nullptr)
                    .ok());
  }
  std::vector<double> ref(u.begin(), u.end());
  ExpectNear(a, ref, 1e-5, "absorbed vs unabsorbed");
}

// Decode context parallelism: every shard attends over its latents only (local indices, global
// positions), and merging the shards' (out, lse) by LSE gives the fp64 unsharded result, for
// interleaves of one token, two tokens and a block, and queries that see nothing on a shard.
TEST(MlaAttentionTest, DcpShardsMergeToTheUnshardedResult) {
  std::mt19937 rng(29);
  const Case c{{3, 8, 4, 16, 6}, {1, 3, 2, 6}, {9, 14, 2, 21}};
  const Fixture f = Build(c, rng);
  const MlaDims& d = c.dims;
  const double scale = 0.3;
  std::vector<double> want_out, want_lse;
  Reference(f, d, scale, &want_out, &want_lse);
  const int64_t T = f.query_start_loc.back(), S = f.batch.num_seqs;
  const int64_t out_n = T * d.num_heads * d.v_head_dim, lse_n = T * d.num_heads;
  for (int64_t size : {2, 3}) {
    for (int64_t interleave : {1, 2, 4}) {
      for (MlaMode mode : {MlaMode::kAbsorbed, MlaMode::kUnabsorbed}) {
        SCOPED_TRACE(::testing::Message() << "dcp " << size << " interleave " << interleave
                                          << " mode " << static_cast<int>(mode));
        std::vector<float> outs(size * out_n), lses(size * lse_n);
        for (int64_t rank = 0; rank < size; ++rank) {
          const DcpShard dcp{size, rank, interleave};
          // The shard's pool: sequence s's local latent j (global DcpGlobalPos(j)) in block
          // s * max_blocks + j / 4, copied from the unsharded fixture.
          std::vector<float> pool(f.pool.size(), 0.0f);
          std::vector<int32_t> tables(S * f.max_blocks), local_lens(S);
          for (int64_t s = 0; s < S; ++s) {
            local_lens[s] = static_cast<int32_t>(DcpLocalCount(f.seq_lens[s], dcp));
            for (int64_t b = 0; b < f.max_blocks; ++b) {
              tables[s * f.max_blocks + b] = static_cast<int32_t>(s * f.max_blocks + b);
            }
            for (int64_t j = 0; j < local_lens[s]; ++j) {
              const int64_t g = DcpGlobalPos(j, dcp);
              const float* src =
                  f.pool.data() +
                  f.layout.TileOffset(f.block_tables[s * f.max_blocks + g / 4], 1, 0) +
                  (g % 4) * d.LatentDim();
              float* dst = pool.data() +
                           f.layout.TileOffset(tables[s * f.max_blocks + j / 4], 1, 0) +
                           (j % 4) * d.LatentDim();
              std::copy_n(src, d.LatentDim(), dst);
            }
          }
          AttentionBatch batch = f.batch;
          batch.block_tables = tables.data();
          batch.local_seq_lens = local_lens.data();
          ASSERT_TRUE(cpu::MlaPagedAttention(f.q.data(), f.kv_b.data(), d, {pool.data(), f.layout},
                                             1, batch, static_cast<float>(scale), mode,
                                             outs.data() + rank * out_n, lses.data() + rank * lse_n,
                                             nullptr, dcp)
                          .ok());
        }
        std::vector<float> out(out_n), lse(lse_n);
        cpu::MergeAttnStatesN({outs.data(), out_n, lses.data(), lse_n, size}, T, d.num_heads,
                              d.v_head_dim, out.data(), lse.data());
        ExpectNear(out, want_out, 2e-5, "merged out");
        ExpectNear(lse, want_lse, 2e-5, "merged lse");
      }
    }
  }
  // A shard without local_seq_lens is refused.
  std::vector<float> out(out_n), lse(lse_n);
  EXPECT_EQ(cpu::MlaPagedAttention(
                f.q.data(), f.kv_b.data(), d, {const_cast<float*>(f.pool.data()), f.layout}, 1,
                f.batch, 0.3f, MlaMode::kAuto, out.data(), lse.data(), nullptr, DcpShard{2, 0, 1})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlaAttentionTest, RefusesAGqaCacheAndBadScale) {
  std::mt19937 rng(3);
  const Case c{{2, 4, 2, 8, 4}, {1}, {3}};
  Fixture f = Build(c, rng);
  std::vector<float> out(2 * 4), lse(2);
  KvCacheLayout gqa = f.layout;
  gqa.num_planes = 2;
  gqa.head_dim = c.dims.LatentDim() / 2;
  EXPECT_EQ(cpu::MlaPagedAttention(f.q.data(), f.kv_b.data(), c.dims, {f.pool.data(), gqa}, 1,
                                   f.batch, 0.5f, MlaMode::kAuto, out.data(), lse.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::MlaPagedAttention(f.q.data(), f.kv_b.data(), c.dims, {f.pool.data(), f.layout}, 1,
                                   f.batch, 0.0f, MlaMode::kAuto, out.data(), lse.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Interleaved pairs and rotate-half against fp64 rotations, with YaRN's cos/sin factor, on rows
// embedded at an offset inside wider rows (q_pe inside q, k_pe inside the kv_a output).
TEST(MlaRopeTest, RotatesTheDecoupledPartOnly) {
  std::mt19937 rng(11);
  const int64_t T = 3, rows = 2, stride = 10, offset = 4, dim = 6;
  const std::vector<int64_t> positions = {0, 5, 17};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f};
  for (bool interleave : {true, false}) {
    std::vector<float> x = Random(rng, T * rows * stride, 1.0f);
    const std::vector<float> before = x;
    cpu::ApplyMlaRope(positions.data(), T, inv_freq.data(), dim, 1.25f, interleave,
                      {x.data(), rows, stride, offset});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = (t * rows + r) * stride;
        for (int64_t e = 0; e < stride; ++e) {
          if (e < offset || e >= offset + dim) {
            EXPECT_EQ(x[base + e], before[base + e]);
          }
        }
        for (int64_t i = 0; i < dim / 2; ++i) {
          const int64_t a = base + offset + (interleave ? 2 * i : i);
          const int64_t b = base + offset + (interleave ? 2 * i + 1 : i + dim / 2);
          const double angle = double(positions[t]) * inv_freq[i];
          const double c = std::cos(angle) * 1.25, s = std::sin(angle) * 1.25;
          EXPECT_NEAR(x[a], before[a] * c - before[b] * s, 1e-5);
          EXPECT_NEAR(x[b], before[b] * c + before[a] * s, 1e-5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
