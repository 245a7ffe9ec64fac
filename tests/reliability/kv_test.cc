// The KV cache under pressure and across tenants (tests/reliability/README.md):
//   * pools far smaller than the concurrent demand: requests are preempted and recomputed, none
//     deadlocks (P's leases wait on D's blocks, D's loads wait on its running requests), every
//     one completes with the tokens it has alone;
//   * a request bigger than a decode worker's whole pool is refused INVALID_ARGUMENT and the
//     KV P leased for it comes back at once;
//   * cache_salt isolates tenants: no prefix-cache hit across salts, on P or on D.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

// 16 tokens x 4 KiB per token of kSmallModel = 64 KiB per block.
constexpr int kBlockBytes = 64 << 10;

void ManyLongRequestsOnTinyPools(e2e::ClusterOptions options) {
  auto cluster = Start(options);
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 4, 2);
  const LeakCheck leaks(*cluster);
  constexpr int kRequests = 12;
  std::vector<v1::GenerateRequest> requests;
  // ~13 blocks each (48-63 prompt tokens + 150 new): 12 at once need ~156 blocks of 16.
  for (int i = 0; i < kRequests; ++i) requests.push_back(MakeRequest(4000 + i, 48 + i, 150));
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back(
        [&, i] { outcomes[i] = RunRequest(cluster->router(), requests[i], absl::Seconds(120)); });
  }
  for (std::thread& t : threads) t.join();
  std::printf("%d requests on %d-block pools: all done in %s\n", kRequests, 16,
              absl::FormatDuration(absl::Now() - start).c_str());
  // Every KV load on D read blocks under a live lease: never more loads than leases (a
  // preempted request once read its source's blocks again after the release).
  uint64_t leases = 0, loads = 0;
  for (e2e::WorkerHandle& w : cluster->workers()) {
    absl::StatusOr<v1::WorkerStats> s = cluster->Stats(w.id);
    if (!s.ok()) continue;
    leases += s->leases_granted();
    loads += s->kv_loads_completed() + s->kv_load_failures();
    std::printf(
        "  %s: leases granted %llu released %llu expired %llu; KV loads %llu, failed %llu\n",
        w.id.c_str(), static_cast<unsigned long long>(s->leases_granted()),
        static_cast<unsigned long long>(s->leases_released()),
        static_cast<unsigned long long>(s->leases_expired()),
        static_cast<unsigned long long>(s->kv_loads_completed()),
        static_cast<unsigned long long>(s->kv_load_failures()));
  }
  EXPECT_LE(loads, leases) << "a KV load without a lease of its own";
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok())
        << i << ": " << outcomes[i].status.error_message() << cluster->Logs();
    Outcome alone = RunRequest(cluster->router(), requests[i]);
    ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
    size_t diverge = 0;
    while (diverge < alone.tokens.size() && diverge < outcomes[i].tokens.size() &&
           alone.tokens[diverge] == outcomes[i].tokens[diverge]) {
      ++diverge;
    }
    EXPECT_EQ(outcomes[i].tokens, alone.tokens)
        << "request " << i << " under preemption: " << outcomes[i].tokens.size() << " vs "
        << alone.tokens.size() << " tokens, first difference at " << diverge;
  }
  ExpectNothingLost(*cluster, leaks);
}

TEST(KvTest, PoolFullPreemptsWithoutDeadlockPrefillDecode) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.worker_flags = {absl::StrCat("--kv_cache_bytes=", 16 * kBlockBytes)};
  ManyLongRequestsOnTinyPools(options);
}

TEST(KvTest, DecodePoolFullPreemptsWithoutDeadlock) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.decode_flags = {absl::StrCat("--kv_cache_bytes=", 16 * kBlockBytes)};
  ManyLongRequestsOnTinyPools(options);
}

TEST(KvTest, PrefillPoolFullWaitsWithoutDeadlock) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.prefill_flags = {absl::StrCat("--kv_cache_bytes=", 16 * kBlockBytes)};
  ManyLongRequestsOnTinyPools(options);
}

TEST(KvTest, PoolFullPreemptsWithoutDeadlockMixed) {
  e2e::ClusterOptions options = SmallModelCluster(0, 0, 1);
  options.worker_flags = {absl::StrCat("--kv_cache_bytes=", 16 * kBlockBytes)};
  ManyLongRequestsOnTinyPools(options);
}

TEST(KvTest, RequestBiggerThanTheDecodePoolIsRefusedAndPReleasesItsKv) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.decode_flags = {absl::StrCat("--kv_cache_bytes=", 16 * kBlockBytes)};
  auto cluster = Start(options);
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 4, 2);
  const LeakCheck leaks(*cluster);
  // 100 + 400 tokens = 32 blocks; D has 16.
  Outcome o = RunRequest(cluster->router(), MakeRequest(5000, 100, 400));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << o.status.error_message();
  EXPECT_NE(o.status.error_message().find("KV blocks"), std::string::npos)
      << o.status.error_message();
  const absl::Time ended = absl::Now();
  ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(5)).ok());
  EXPECT_LE(absl::Now() - ended, absl::Seconds(1)) << "P held the refused request's KV";
  ExpectNothingLost(*cluster, leaks);
}

struct PrefixHits {
  uint64_t prefill = 0;
  uint64_t decode = 0;
};

PrefixHits Hits(Cluster& cluster) {
  PrefixHits h;
  for (e2e::WorkerHandle& w : cluster.workers()) {
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(w.id);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) continue;
    (w.role == "prefill" ? h.prefill : h.decode) += s->prefix_cache_hit_tokens();
  }
  return h;
}

// The first request of every tenant, with the very prompt other tenants already cached, gets no
// cached token (usage and both workers' counters); the tenant's own repeat does.
TEST(KvTest, CacheSaltIsolatesTenants) {
  auto cluster = Start(SmallModelCluster(1, 1, 0));
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 4, 2);
  const LeakCheck leaks(*cluster);
  const v1::GenerateRequest prompt = MakeRequest(6000, 160, 4);  // 10 full blocks
  auto run = [&](const std::string& salt) {
    v1::GenerateRequest r = prompt;
    r.set_cache_salt(salt);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = cluster->router().Generate(&ctx, r);
    v1::GenerateResponse msg;
    uint32_t cached = 0;
    while (reader->Read(&msg)) {
      if (msg.has_usage()) cached = msg.usage().cached_prompt_tokens();
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return cached;
  };
  std::vector<std::string> tenants = {"", "tenant-a", "tenant-b"};
  for (int i = 0; i < 7; ++i)
    tenants.push_back(absl::StrCat("tenant-", i, "-", std::string(i, 'x')));
  for (const std::string& tenant : tenants) {
    SCOPED_TRACE("tenant '" + tenant + "'");
    const PrefixHits before = Hits(*cluster);
    EXPECT_EQ(run(tenant), 0u) << "a hit on another tenant's prompt";
    const PrefixHits after = Hits(*cluster);
    EXPECT_EQ(after.prefill, before.prefill);
    EXPECT_EQ(after.decode, before.decode);
  }
  for (const std::string& tenant : tenants) {
    SCOPED_TRACE("tenant '" + tenant + "' again");
    const PrefixHits before = Hits(*cluster);
    EXPECT_GE(run(tenant), 128u) << "the tenant's own prefix is cached";
    EXPECT_GE(Hits(*cluster).prefill, before.prefill + 128);
  }
  ExpectNothingLost(*cluster, leaks);
}

}  // namespace
}  // namespace tandem::reliability
