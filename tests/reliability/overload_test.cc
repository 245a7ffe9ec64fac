// Overload at 3x capacity (tests/reliability/README.md): the excess is shed at once with
// RESOURCE_EXHAUSTED while the admitted requests complete with the right tokens; afterwards
// every KV pool is whole, no P lease was left to expire, and no thread or fd leaked.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

struct Tally {
  int ok = 0;
  int exhausted = 0;
  std::vector<std::string> other;
};

// Sends `requests` at once (a barrier releases every thread together) and checks each admitted
// one against the same request run alone afterwards (greedy: the same tokens).
Tally Flood(Cluster& cluster, const std::vector<v1::GenerateRequest>& requests) {
  const int n = static_cast<int>(requests.size());
  std::vector<Outcome> outcomes(n);
  absl::Barrier* start = new absl::Barrier(n);  // Block() deletes it after the last thread
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start->Block();
      outcomes[i] = RunRequest(cluster.router(), requests[i], absl::Seconds(120));
    });
  }
  for (std::thread& t : threads) t.join();
  Tally tally;
  for (int i = 0; i < n; ++i) {
    const Outcome& o = outcomes[i];
    if (o.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++tally.exhausted;
      // A decode worker sheds after P's first token reached the client (TTFT does not wait
      // for D); nothing more may come.
      EXPECT_LE(o.tokens.size(), 1u) << "a shed request streamed tokens";
      EXPECT_LT(o.took, absl::Seconds(5)) << "shedding must not wait: " << o.status.error_message();
      continue;
    }
    if (!o.status.ok()) {
      tally.other.push_back(absl::StrCat(o.status.error_code(), " ", o.status.error_message()));
      continue;
    }
    ++tally.ok;
    Outcome alone = RunRequest(cluster.router(), requests[i], absl::Seconds(60));
    EXPECT_TRUE(alone.status.ok()) << alone.status.error_message();
    EXPECT_EQ(o.tokens, alone.tokens) << "request " << i << " admitted under overload";
    EXPECT_EQ(o.tokens.size(), requests[i].sampling().max_tokens());
  }
  std::printf("%d requests: %d completed, %d RESOURCE_EXHAUSTED, %zu other\n", n, tally.ok,
              tally.exhausted, tally.other.size());
  return tally;
}

void ExpectNoLeaseExpired(Cluster& cluster) {
  for (e2e::WorkerHandle& w : cluster.workers()) {
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(w.id);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->leases_expired(), 0u) << w.id << ": a lease was left to expire";
    EXPECT_EQ(s->leases_granted(), s->leases_released()) << w.id;
  }
}

// The router admits --max_queue requests in flight; 3x that many at once: the rest are refused
// before any worker is called.
TEST(OverloadTest, RouterShedsBeyondMaxQueue) {
  constexpr int kCapacity = 4;
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.router_flags = {absl::StrCat("--max_queue=", kCapacity)};
  auto cluster = Start(options);
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 8, kCapacity);
  const LeakCheck leaks(*cluster);
  for (int round = 0; round < Iterations(2, 10); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::vector<v1::GenerateRequest> requests;
    // ~0.5 s of decoding each: the admitted ones surely run while the rest arrive.
    for (int i = 0; i < 3 * kCapacity; ++i) {
      requests.push_back(MakeRequest(100 * round + i, 30 + i, 800));
    }
    const Tally t = Flood(*cluster, requests);
    EXPECT_EQ(t.ok, kCapacity);
    EXPECT_EQ(t.exhausted, 2 * kCapacity);
    EXPECT_TRUE(t.other.empty()) << t.other.front();
    ExpectNothingLost(*cluster, leaks);
  }
  ExpectNoLeaseExpired(*cluster);
}

// The workers bound their own queues (--max_num_seqs running, --max_queued_requests waiting).
// `bounded_role`'s are small (2 + 2), the other's large: with "prefill" the prefill worker
// refuses prefills beyond them; with "decode" every prompt is prefilled and leased on P, the
// decode worker refuses most decodes, and the KV P leased for each refused request must come
// back at once (the router aborts it on P), not when the lease expires.
void WorkersShedBeyondTheirQueues(const std::string& bounded_role) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  const std::vector<std::string> small = {"--max_num_seqs=2", "--max_queued_requests=2"};
  const std::vector<std::string> large = {"--max_num_seqs=16", "--max_queued_requests=16"};
  options.prefill_flags = bounded_role == "prefill" ? small : large;
  options.decode_flags = bounded_role == "decode" ? small : large;
  auto cluster = Start(options);
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 8, 2);
  const LeakCheck leaks(*cluster);
  for (int round = 0; round < Iterations(2, 10); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::vector<v1::GenerateRequest> requests;
    // Capacity 4 (2 running + 2 waiting); 12 at once. Long prompts keep P busy (~0.1 s each),
    // long outputs keep D busy.
    for (int i = 0; i < 12; ++i) requests.push_back(MakeRequest(500 + 100 * round + i, 500, 800));
    const Tally t = Flood(*cluster, requests);
    EXPECT_GE(t.ok, 2) << "the bounded worker's capacity is served";
    EXPECT_GE(t.exhausted, 4) << "3x capacity is shed";
    EXPECT_EQ(t.ok + t.exhausted, 12);
    EXPECT_TRUE(t.other.empty()) << t.other.front();
    ExpectNothingLost(*cluster, leaks, absl::Seconds(2));
  }
  ExpectNoLeaseExpired(*cluster);
  absl::StatusOr<v1::WorkerStats> p = cluster->Stats("prefill-0");
  ASSERT_TRUE(p.ok());
  if (bounded_role == "decode") {
    EXPECT_GT(p->leases_granted(), 12u) << "P prefilled the requests D then refused";
  }
  // The cluster serves normally afterwards.
  Outcome o = RunRequest(cluster->router(), MakeRequest(7, 20, 16));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
}

TEST(OverloadTest, PrefillWorkerShedsBeyondItsQueue) { WorkersShedBeyondTheirQueues("prefill"); }
TEST(OverloadTest, DecodeWorkerShedsBeyondItsQueueAndPReleasesTheKv) {
  WorkersShedBeyondTheirQueues("decode");
}

}  // namespace
}  // namespace tandem::reliability
