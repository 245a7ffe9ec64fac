// MoeAllToAll (wide EP's dispatch -> experts -> combine) against the single-process reference
// kernels::cpu::FusedMoe holding every expert, on fresh random inputs: three ranks (threads, Gloo
// on loopback) with uneven token counts, one of them 0; placements contiguous and scattered;
// exactly one AllGather (the splits) and two AllToAlls per call; every row's destination is the
// rank holding its expert.
#include "runtime/cpu/moe_all_to_all.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "comm/counting_process_group.h"
#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

constexpr int kRanks = 3;
constexpr int64_t kExperts = 6, kTopK = 2, kHidden = 16, kInter = 8;

struct Inputs {
  std::vector<float> gate_up, down;          // every expert: [E, 2I, H], [E, H, I]
  std::vector<std::vector<float>> x;         // [rank][T, H]
  std::vector<kernels::MoeRouting> routing;  // [rank]
};

Inputs MakeInputs(const std::vector<int64_t>& tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  Inputs in;
  in.gate_up.resize(kExperts * 2 * kInter * kHidden);
  in.down.resize(kExperts * kHidden * kInter);
  for (float& v : in.gate_up) v = normal(rng);
  for (float& v : in.down) v = normal(rng);
  for (int64_t T : tokens) {
    in.x.emplace_back(T * kHidden);
    for (float& v : in.x.back()) v = normal(rng);
    kernels::MoeRouting r;
    r.num_tokens = T;
    r.top_k = kTopK;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> ids(kExperts);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int64_t j = 0; j < kTopK; ++j) {
        r.expert_ids.push_back(ids[j]);
        r.weights.push_back(weight(rng));
      }
    }
    in.routing.push_back(r);
  }
  return in;
}

// The experts `rank` holds under `placement`, stacked in experts_of order.
std::vector<float> Stack(const std::vector<float>& all, int64_t per_expert,
                         const std::vector<int32_t>& experts) {
  std::vector<float> out;
  for (int32_t e : experts) {
    out.insert(out.end(), all.begin() + e * per_expert, all.begin() + (e + 1) * per_expert);
  }
  return out;
}

void ExpectMatchesReference(const ExpertPlacement& placement, const std::vector<int64_t>& tokens,
                            uint32_t seed) {
  const Inputs in = MakeInputs(tokens, seed);
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::vector<float>> got(kRanks);
  std::vector<comm::CollectiveCounts> counts(kRanks);
  std::vector<std::vector<int64_t>> sent(kRanks), received(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooGroupOptions options;
      options.rank = r;
      options.world_size = kRanks;
      options.store_port = (*server)->port();
      options.serve_store = false;
      options.timeout = absl::Seconds(60);
      auto gloo = comm::GlooProcessGroup::Create(options);
      ASSERT_TRUE(gloo.ok()) << gloo.status();
      comm::CountingProcessGroup counting(gloo->get());
      const std::vector<int32_t>& mine = placement.experts_of(r);
      const std::vector<float> gate_up = Stack(in.gate_up, 2 * kInter * kHidden, mine);
      const std::vector<float> down = Stack(in.down, kHidden * kInter, mine);
      const kernels::MoeExpertWeights experts{gate_up.data(), down.data(),
                                              static_cast<int64_t>(mine.size()), kHidden, kInter};
      MoeAllToAll step(&counting);
      got[r].assign(tokens[r] * kHidden, -1.0f);
      const absl::Status status = step.Run(in.routing[r], placement, experts, in.x[r].data(),
                                           kHidden, got[r].data(), nullptr);
      ASSERT_TRUE(status.ok()) << status;
      counts[r] = counting.counts();
      sent[r] = step.last_sent_rows();
      received[r] = step.last_received_rows();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_FALSE(::testing::Test::HasFailure());
  const kernels::MoeExpertWeights all{in.gate_up.data(), in.down.data(), kExperts, kHidden, kInter};
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(counts[r].all_gather, 1) << "rank " << r;
    EXPECT_EQ(counts[r].all_to_all, 2) << "rank " << r;
    EXPECT_EQ(counts[r].all_reduce + counts[r].broadcast + counts[r].send, 0) << "rank " << r;
    // Rows to each rank = this rank's (token, choice) pairs whose expert that rank holds.
    std::vector<int64_t> want_sent(kRanks, 0);
    for (int32_t e : in.routing[r].expert_ids) ++want_sent[placement.rank_of(e)];
    EXPECT_EQ(sent[r], want_sent) << "rank " << r;
    for (int src = 0; src < kRanks; ++src) EXPECT_EQ(received[r][src], sent[src][r]);
    if (tokens[r] == 0) continue;
    std::vector<float> want(tokens[r] * kHidden);
    kernels::MoeScratch scratch;
    ASSERT_TRUE(
        kernels::cpu::FusedMoe(in.x[r].data(), in.routing[r], all, want.data(), nullptr, &scratch)
            .ok());
    float scale = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::abs(want[i]));
      worst = std::max(worst, std::abs(got[r][i] - want[i]));
    }
    EXPECT_GT(scale, 0.0f);
    EXPECT_LE(worst, 1e-5f * scale) << "rank " << r;
  }
}

TEST(MoeAllToAllTest, ContiguousPlacementUnevenTokens) {
  auto placement = ExpertPlacement::Contiguous(kExperts, kRanks);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ExpectMatchesReference(*placement, {7, 0, 3}, 1);
  ExpectMatchesReference(*placement, {1, 12, 5}, 2);
}

// Rank 2 holds no expert at all (it only sends and receives back); rank 0 holds four.
TEST(MoeAllToAllTest, ScatteredPlacementAndAnExpertlessRank) {
  auto placement = ExpertPlacement::FromTable({0, 1, 0, 0, 1, 0}, kRanks);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ExpectMatchesReference(*placement, {4, 6, 9}, 3);
}

}  // namespace
}  // namespace tandem::runtime
