// The dispatch plan (moe_dispatch.h) and its fixed-capacity layout against brute force, and the
// deduplicated dispatch / combine of wide expert parallelism simulated on the host over N ranks
// (uneven splits, and the fixed layout of CUDA graph steps with its padding rows) (rows built from
// the plan and MoeDispatchRowMeta, each receiver's experts through FusedMoe with the -1 choices on
// an all-zero expert, rows summed back in rank order) against FusedMoe over every expert on every
// token.
#include "kernels/moe/moe_dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/moe/moe.h"

namespace tandem::kernels {
namespace {

std::vector<float> Random(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Top-k of fresh random logits (distinct ids, weights renormalised).
MoeRouting RandomRouting(std::mt19937& rng, int64_t T, int64_t E, int64_t k) {
  const std::vector<float> logits = Random(rng, T * E, 3.0f);
  MoeRouting r;
  MoeRoutingParams p{E, k, /*renormalize=*/true};
  EXPECT_TRUE(cpu::SoftmaxTopK(logits.data(), T, p, &r).ok());
  return r;
}

std::vector<int32_t> ContiguousRanks(int64_t E, int n) {
  std::vector<int32_t> rank(E);
  for (int64_t e = 0; e < E; ++e) rank[e] = static_cast<int32_t>(e / (E / n));
  return rank;
}

TEST(MoeDispatchTest, PlanIsTokenOrderOncePerRank) {
  std::mt19937 rng(11);
  for (int n : {1, 2, 3, 4}) {
    for (int64_t k : {1, 2, 4}) {
      const int64_t E = 12, T = 37;
      std::vector<int32_t> rank_of(E);
      for (int32_t& r : rank_of) r = static_cast<int32_t>(rng() % n);  // any table
      const MoeRouting routing = RandomRouting(rng, T, E, k);
      absl::StatusOr<MoeDispatchPlan> plan = PlanMoeDispatch(routing.expert_ids, k, rank_of, n);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<int32_t> next(n, 0);
      for (int64_t t = 0; t < T; ++t) {
        for (int d = 0; d < n; ++d) {
          bool any = false;
          for (int64_t j = 0; j < k; ++j) any |= rank_of[routing.expert_ids[t * k + j]] == d;
          const int32_t p = plan->pos[t * n + d];
          if (!any) {
            EXPECT_EQ(p, -1) << "t " << t << " d " << d;
            continue;
          }
          EXPECT_EQ(p, next[d]++) << "t " << t << " d " << d;  // token order, each once
        }
      }
      for (int d = 0; d < n; ++d) EXPECT_EQ(plan->counts[d], next[d]);
      // The fixed-capacity layout: slice d holds the tokens that reach rank d in order, then -1.
      for (int64_t cap : {T, T + 3}) {
        absl::StatusOr<std::vector<int32_t>> rows = MoeDispatchFixedRows(*plan, cap);
        ASSERT_TRUE(rows.ok()) << rows.status();
        ASSERT_EQ(static_cast<int64_t>(rows->size()), n * cap);
        for (int d = 0; d < n; ++d) {
          int64_t i = 0;
          for (int64_t t = 0; t < T; ++t) {
            bool any = false;
            for (int64_t j = 0; j < k; ++j) any |= rank_of[routing.expert_ids[t * k + j]] == d;
            if (any) {
              EXPECT_EQ((*rows)[d * cap + i++], t) << "d " << d;
            }
          }
          for (; i < cap; ++i) EXPECT_EQ((*rows)[d * cap + i], -1) << "d " << d << " i " << i;
        }
      }
      const int32_t most = *std::max_element(plan->counts.begin(), plan->counts.end());
      if (most > 0) {
        const absl::Status small = MoeDispatchFixedRows(*plan, most - 1).status();
        EXPECT_FALSE(small.ok());
        EXPECT_NE(small.message().find(absl::StrCat(most, " rows to rank")), std::string::npos)
            << small;
      }
    }
  }
  EXPECT_FALSE(PlanMoeDispatch({0, 1}, 2, {0, 0}, 0).ok());
  EXPECT_FALSE(PlanMoeDispatch({0, 5}, 2, {0, 0}, 1).ok());     // expert out of range
  EXPECT_FALSE(PlanMoeDispatch({0, 1}, 2, {0, 3}, 2).ok());     // rank out of range
  EXPECT_FALSE(PlanMoeDispatch({0, 1, 0}, 2, {0, 0}, 1).ok());  // not [T, k]
}

TEST(MoeDispatchTest, SplitsFromTheCountsMatrix) {
  // Rank s sends all[s][d] rows to rank d.
  const std::vector<int32_t> all = {1, 2, 0,  //
                                    3, 0, 4,  //
                                    5, 6, 7};
  absl::StatusOr<MoeDispatchSplits> s = MoeDispatchSplitsOf(all, 3, 1, 100);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->send_rows, (std::vector<int64_t>{3, 0, 4}));
  EXPECT_EQ(s->recv_rows, (std::vector<int64_t>{2, 0, 6}));
  EXPECT_EQ(s->sent, 7);
  EXPECT_EQ(s->received, 8);
  EXPECT_FALSE(MoeDispatchSplitsOf(all, 3, 1, 7).ok());  // more than the buffers hold
  EXPECT_NE(MoeDispatchSplitsOf(all, 3, 1, 7).status().message().find("receives 8 rows"),
            std::string::npos);
  EXPECT_FALSE(MoeDispatchSplitsOf(all, 2, 1, 100).ok());  // matrix of another size
  EXPECT_FALSE(MoeDispatchSplitsOf({0, -1, 0, 0}, 2, 0, 100).ok());
  EXPECT_EQ(MoeDispatchRowWidth(16, 1), 24);
  EXPECT_EQ(MoeDispatchRowWidth(16, 2), 24);
  EXPECT_EQ(MoeDispatchRowWidth(2048, 8), 2048 + 32);
}

// One rank's experts stacked in placement order plus the all-zero expert the -1 choices meet.
struct HeldExperts {
  std::vector<float> gate_up, down;
  MoeExpertWeights view;
};

HeldExperts Hold(const std::vector<float>& gate_up, const std::vector<float>& down,
                 const std::vector<int32_t>& held, int64_t H, int64_t I) {
  HeldExperts h;
  const int64_t gu = 2 * I * H, dn = H * I, n = static_cast<int64_t>(held.size());
  h.gate_up.assign((n + 1) * gu, 0.0f);
  h.down.assign((n + 1) * dn, 0.0f);
  for (int64_t s = 0; s < n; ++s) {
    std::copy_n(gate_up.begin() + held[s] * gu, gu, h.gate_up.begin() + s * gu);
    std::copy_n(down.begin() + held[s] * dn, dn, h.down.begin() + s * dn);
  }
  h.view = {h.gate_up.data(), h.down.data(), n + 1, H, I};
  return h;
}

// Every rank's tokens through the deduplicated exchange, as the device path runs it: uneven
// splits from the counts matrix (capacity 0), or the fixed layout of CUDA graph steps (capacity
// > 0: every pair moves `capacity` rows, padding included, and the receiver computes them all).
void ExchangeEqualsTheWholeLayer(int64_t extra_capacity) {
  std::mt19937 rng(7);
  const int64_t E = 8, H = 16, I = 8;
  for (int n : {2, 4}) {
    for (int64_t k : {2, 3}) {
      const std::vector<float> gate_up = Random(rng, E * 2 * I * H, 0.5f);
      const std::vector<float> down = Random(rng, E * H * I, 0.5f);
      const MoeExpertWeights all{gate_up.data(), down.data(), E, H, I};
      const std::vector<int32_t> rank_of = ContiguousRanks(E, n);
      std::vector<std::vector<int32_t>> held(n);
      std::vector<int32_t> slot(E);
      for (int64_t e = 0; e < E; ++e) {
        slot[e] = static_cast<int32_t>(held[rank_of[e]].size());
        held[rank_of[e]].push_back(static_cast<int32_t>(e));
      }
      // Rank 1 is idle (no tokens); the others 5..9 tokens.
      std::vector<int64_t> tokens(n);
      std::vector<std::vector<float>> x(n);
      std::vector<MoeRouting> routing(n);
      std::vector<MoeDispatchPlan> plan(n);
      for (int r = 0; r < n; ++r) {
        tokens[r] = r == 1 ? 0 : 5 + r;
        x[r] = Random(rng, tokens[r] * H, 1.0f);
        routing[r] = RandomRouting(rng, tokens[r], E, k);
        absl::StatusOr<MoeDispatchPlan> p = PlanMoeDispatch(routing[r].expert_ids, k, rank_of, n);
        ASSERT_TRUE(p.ok()) << p.status();
        plan[r] = *p;
      }
      const int64_t cap =
          extra_capacity < 0 ? 0 : *std::max_element(tokens.begin(), tokens.end()) + extra_capacity;
      // sent[s][d]: the tokens rank s sends rank d in its send order (-1: a padding row).
      std::vector<std::vector<std::vector<int32_t>>> sent(n, std::vector<std::vector<int32_t>>(n));
      std::vector<int32_t> all_counts;
      for (int s = 0; s < n; ++s) {
        all_counts.insert(all_counts.end(), plan[s].counts.begin(), plan[s].counts.end());
        absl::StatusOr<std::vector<int32_t>> fixed = MoeDispatchFixedRows(plan[s], cap);
        ASSERT_EQ(fixed.ok(), cap > 0) << fixed.status();
        for (int d = 0; d < n; ++d) {
          if (cap > 0) {
            sent[s][d].assign(fixed->begin() + d * cap, fixed->begin() + (d + 1) * cap);
            continue;
          }
          for (int64_t t = 0; t < tokens[s]; ++t) {
            if (plan[s].pos[t * n + d] >= 0) sent[s][d].push_back(static_cast<int32_t>(t));
          }
        }
      }
      // back[s][d]: the rows rank d returns to rank s, in s's send order.
      std::vector<std::vector<std::vector<float>>> back(n, std::vector<std::vector<float>>(n));
      for (int d = 0; d < n; ++d) {
        absl::StatusOr<MoeDispatchSplits> splits = MoeDispatchSplitsOf(all_counts, n, d, 1000);
        ASSERT_TRUE(splits.ok()) << splits.status();
        MoeRouting local;
        local.top_k = k;
        std::vector<float> rows;
        std::vector<int> from;
        for (int s = 0; s < n; ++s) {  // sources in rank order, each in its send order
          int64_t real = 0;
          for (const int32_t t : sent[s][d]) {
            real += t >= 0;
            std::vector<int32_t> sl(k, -1);  // a padding row: zeros, every slot -1
            std::vector<float> w(k, 0.0f);
            if (t >= 0) {
              rows.insert(rows.end(), x[s].begin() + t * H, x[s].begin() + (t + 1) * H);
              MoeDispatchRowMeta(routing[s].expert_ids, routing[s].weights, t, k, d, rank_of, slot,
                                 sl.data(), w.data());
            } else {
              rows.insert(rows.end(), H, 0.0f);
            }
            for (int64_t j = 0; j < k; ++j) {  // the receiver: -1 -> its zero expert, weight 0
              local.expert_ids.push_back(sl[j] >= 0 ? sl[j] : static_cast<int32_t>(held[d].size()));
              local.weights.push_back(sl[j] >= 0 ? w[j] : 0.0f);
            }
            from.push_back(s);
          }
          EXPECT_EQ(real, splits->recv_rows[s]);
        }
        local.num_tokens = static_cast<int64_t>(from.size());
        EXPECT_EQ(local.num_tokens, cap > 0 ? n * cap : splits->received);
        HeldExperts mine = Hold(gate_up, down, held[d], H, I);
        std::vector<float> out(local.num_tokens * H);
        MoeScratch scratch;
        if (local.num_tokens > 0) {
          ASSERT_TRUE(
              cpu::FusedMoe(rows.data(), local, mine.view, out.data(), nullptr, &scratch).ok());
        }
        for (int64_t r = 0; r < local.num_tokens; ++r) {
          back[from[r]][d].insert(back[from[r]][d].end(), out.begin() + r * H,
                                  out.begin() + (r + 1) * H);
        }
      }
      for (int s = 0; s < n; ++s) {
        std::vector<float> want(tokens[s] * H);
        MoeScratch scratch;
        if (tokens[s] > 0) {
          ASSERT_TRUE(
              cpu::FusedMoe(x[s].data(), routing[s], all, want.data(), nullptr, &scratch).ok());
        }
        for (int64_t t = 0; t < tokens[s]; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            float got = 0.0f;
            for (int d = 0; d < n; ++d) {
              const int32_t p = plan[s].pos[t * n + d];
              if (p >= 0) got += back[s][d][p * H + h];
            }
            ASSERT_NEAR(got, want[t * H + h], 1e-5f) << "n " << n << " k " << k << " rank " << s;
          }
        }
        for (int d = 0; d < n; ++d) {  // padding rows come back as zeros (never read)
          for (int64_t p = plan[s].counts[d]; p < cap; ++p) {
            for (int64_t h = 0; h < H; ++h) ASSERT_EQ(back[s][d][p * H + h], 0.0f);
          }
        }
      }
    }
  }
}

TEST(MoeDispatchTest, DedupedExchangeEqualsTheWholeLayer) { ExchangeEqualsTheWholeLayer(-1); }

// The fixed layout at the step's largest batch (capacity = max tokens) and with spare rows.
TEST(MoeDispatchTest, FixedCapacityExchangeEqualsTheWholeLayer) {
  ExchangeEqualsTheWholeLayer(0);
  ExchangeEqualsTheWholeLayer(3);
}

}  // namespace
}  // namespace tandem::kernels
