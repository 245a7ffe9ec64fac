// Process faults during a request (tests/reliability/README.md): kill -9 and SIGSTOP of the
// prefill worker during prefill and during the decode worker's KV read, of the decode worker
// mid-stream, and of the router. The client always gets an answer in bounded time (a status
// or, where D can recompute, the whole correct output), never a hang; after the fault is over
// every surviving or restarted worker's KV pool is whole and no daemon leaked threads or fds.
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

// Prompts in chunks of 256 tokens on P, so a prefill visibly runs for several steps.
std::unique_ptr<Cluster> StartFaultCluster(std::vector<std::string> worker_flags = {}) {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.prefill_flags = {"--max_num_batched_tokens=256"};
  options.worker_flags = std::move(worker_flags);
  return Start(options);
}

v1::WorkerStats StatsOf(Cluster& cluster, const std::string& worker) {
  absl::StatusOr<v1::WorkerStats> s = cluster.Stats(worker);
  EXPECT_TRUE(s.ok()) << worker << ": " << s.status();
  return s.ok() ? *s : v1::WorkerStats();
}

// Polls until `worker` reports a request running (false after `timeout`).
bool WaitRunning(Cluster& cluster, const std::string& worker, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(worker);
    if (s.ok() && s->load().num_running() > 0) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// The worker was restarted: it serves again, the router lists it healthy, and it gets a baseline
// once it has warmed up.
// The warm-up after a restart: 8 short requests, 4 at a time. A request the router cancels
// because the new process missed its heartbeats (UNAVAILABLE: a restarting worker on a loaded
// 2-core CI machine can stall past --worker_timeout_ms; the worker then registers again) is
// retried once the cluster is healthy again, up to 3 times; any other failure fails the test.
void WarmUpAfterRestart(Cluster& cluster) {
  const int n = 8, concurrency = 4, workers = static_cast<int>(cluster.workers().size());
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&cluster, t, workers] {
      for (int i = t; i < n; i += concurrency) {
        Outcome o;
        for (int attempt = 0; attempt < 4; ++attempt) {
          o = RunRequest(cluster.router(), MakeRequest(1000 + i, 20 + 7 * i, 8));
          if (o.status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
          std::printf("warm-up %d after the restart: %s; retried\n", i,
                      o.status.error_message().c_str());
          EXPECT_TRUE(cluster.WaitHealthy(workers, absl::Seconds(30)).ok());
        }
        EXPECT_TRUE(o.status.ok()) << "warm-up " << i << ": " << o.status.error_message();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  WarmUp(cluster, 0, 1);  // the cancelled long stream only
}

void RestartAndRebase(Cluster& cluster, LeakCheck& leaks, const std::string& worker, int sig) {
  ASSERT_TRUE(cluster.RestartWorker(worker, sig).ok()) << cluster.Logs();
  ASSERT_TRUE(
      cluster.WaitHealthy(static_cast<int>(cluster.workers().size()), absl::Seconds(30)).ok())
      << cluster.Logs();
  WarmUpAfterRestart(cluster);
  leaks.Rebase(cluster, worker);
}

void ExpectServes(Cluster& cluster, uint32_t seed) {
  Outcome o = RunRequest(cluster.router(), MakeRequest(seed, 30, 8), absl::Seconds(30));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message() << cluster.Logs();
  EXPECT_EQ(o.tokens.size(), 8u);
}

// SIGKILL or SIGSTOP of P while it prefills the prompt: the client gets UNAVAILABLE within
// seconds (a dead P: the call fails; a stopped P: its heartbeats stop and the router cancels the
// calls open on it). D never saw the request.
void StopOrKillPrefillDuringPrefill(int sig) {
  auto cluster = StartFaultCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  e2e::WorkerHandle* p = cluster->worker("prefill-0");
  for (int round = 0; round < Iterations(2, 10); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    Stream s(cluster->router(), MakeRequest(300 + round, 1500, 50), absl::Seconds(60));
    ASSERT_TRUE(WaitRunning(*cluster, "prefill-0", absl::Seconds(5))) << cluster->Logs();
    const absl::Time fault = absl::Now();
    p->process->Signal(sig);
    const Outcome o = s.Finish();
    const absl::Duration answered = absl::Now() - fault;
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE) << o.status.error_message();
    EXPECT_TRUE(o.tokens.empty());
    EXPECT_LT(answered, absl::Seconds(10)) << "the client waited " << answered;
    std::printf("P %s during prefill: client answered %s after the fault\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP", absl::FormatDuration(answered).c_str());
    if (sig == SIGSTOP) {
      p->process->Signal(SIGCONT);
      const absl::Time resumed = absl::Now();
      // P finds the call cancelled (or the router's Abort) and drops the prompt and its KV.
      absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(*cluster, absl::Seconds(10));
      ASSERT_TRUE(whole.ok()) << whole.status();
      std::printf("  P whole %s after SIGCONT\n",
                  absl::FormatDuration(absl::Now() - resumed).c_str());
      EXPECT_LE(absl::Now() - resumed, absl::Seconds(2));
      ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(15)).ok()) << cluster->Logs();
    } else {
      ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(2)).ok()) << "D holds nothing";
      RestartAndRebase(*cluster, leaks, "prefill-0", SIGKILL);
    }
    EXPECT_EQ(StatsOf(*cluster, "prefill-0").leases_expired(), 0u);
    ExpectServes(*cluster, 400 + round);
    ExpectNothingLost(*cluster, leaks);
  }
}

TEST(FaultTest, KillPrefillDuringPrefill) { StopOrKillPrefillDuringPrefill(SIGKILL); }
TEST(FaultTest, StopPrefillDuringPrefill) { StopOrKillPrefillDuringPrefill(SIGSTOP); }

// SIGSTOP of P right after its first token reached the client, so the decode worker's read of
// the KV from P stalls (confirmed: D completes no load while P is stopped). Then either P stays
// stopped until D's --kv_load_timeout_ms, or it is killed (the read fails at once). Both ways D
// recomputes the prompt and the client gets the whole, correct output (policy recompute).
// UCX over TCP only (--ucx_tls=tcp), as between hosts: with shared memory (the default
// tcp,self,sm on one host) D copies a stopped P's memory without P's help, and the read never
// stalls.
void FaultPrefillDuringKvRead(bool kill) {
  auto cluster = StartFaultCluster({"--kv_load_timeout_ms=2000", "--ucx_tls=tcp"});
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  e2e::WorkerHandle* p = cluster->worker("prefill-0");
  int hits = 0;
  const int rounds = Iterations(2, 10);
  for (int attempt = 0; attempt < 4 * rounds && hits < rounds; ++attempt) {
    SCOPED_TRACE(testing::Message() << "attempt " << attempt);
    const v1::GenerateRequest request = MakeRequest(600 + attempt, 1500, 40);
    const v1::WorkerStats d_before = StatsOf(*cluster, "decode-0");
    Stream s(cluster->router(), request, absl::Seconds(60));
    ASSERT_EQ(s.ReadTokens(1), 1) << s.Finish().status.error_message();
    p->process->Signal(SIGSTOP);
    const absl::Time stopped = absl::Now();
    absl::SleepFor(absl::Milliseconds(200));
    const bool stalled =
        StatsOf(*cluster, "decode-0").kv_loads_completed() == d_before.kv_loads_completed();
    if (kill) p->process->Signal(SIGKILL);
    const Outcome o = s.Finish();
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.tokens.size(), 40u);
    EXPECT_LT(o.took, absl::Seconds(15));
    const v1::WorkerStats d_after = StatsOf(*cluster, "decode-0");
    if (stalled) {
      ++hits;
      EXPECT_GT(d_after.kv_load_failures(), d_before.kv_load_failures())
          << "D's read was stalled, yet no load failure is counted";
      std::printf("P %s during the KV read: client complete %s after the stop\n",
                  kill ? "SIGKILL" : "SIGSTOP",
                  absl::FormatDuration(absl::Now() - stopped).c_str());
    }
    if (kill) {
      RestartAndRebase(*cluster, leaks, "prefill-0", SIGKILL);
    } else {
      p->process->Signal(SIGCONT);
      const absl::Time resumed = absl::Now();
      // D gave the lease up while P was stopped; P frees the blocks when it hears of it or, if
      // that message was lost, when the lease expires.
      absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(*cluster, absl::Seconds(40));
      ASSERT_TRUE(whole.ok()) << whole.status();
      const v1::WorkerStats p_after = StatsOf(*cluster, "prefill-0");
      std::printf("  P whole %s after SIGCONT (leases released %llu, expired %llu)\n",
                  absl::FormatDuration(absl::Now() - resumed).c_str(),
                  static_cast<unsigned long long>(p_after.leases_released()),
                  static_cast<unsigned long long>(p_after.leases_expired()));
      EXPECT_LE(absl::Now() - resumed, absl::Seconds(2))
          << "P held the stalled request's KV until its lease expired";
      ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(15)).ok()) << cluster->Logs();
    }
    // The same request again, uninterrupted: greedy, so the same tokens.
    Outcome again = RunRequest(cluster->router(), request, absl::Seconds(30));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(o.tokens, again.tokens) << "the recomputed output differs";
    ExpectNothingLost(*cluster, leaks);
  }
  EXPECT_GE(hits, rounds) << "P was never stopped while D was reading";
}

// P stopped (SIGSTOP) while D reads its KV over UCX TCP: D's --kv_load_timeout_ms (2 s here)
// cancels the read; the UCX GETs to a stopped peer cannot be taken back, so the agent closes
// that connection by force 1 s later (ucx_agent_impl.h, ForceStuckCancelsLocked), D recomputes
// and the client gets the full output; D's lease release is retried until P answers again, so P
// frees the blocks right after SIGCONT rather than at lease expiry; the next request re-links.
TEST(FaultTest, StopPrefillDuringKvRead) { FaultPrefillDuringKvRead(/*kill=*/false); }
TEST(FaultTest, KillPrefillDuringKvRead) { FaultPrefillDuringKvRead(/*kill=*/true); }

// SIGKILL or SIGSTOP of D while it streams: the client gets UNAVAILABLE within seconds; P holds
// nothing (the KV was loaded); a stopped D that resumes drops the request.
void StopOrKillDecodeMidStream(int sig) {
  auto cluster = StartFaultCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  e2e::WorkerHandle* d = cluster->worker("decode-0");
  for (int round = 0; round < Iterations(2, 10); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    Stream s(cluster->router(), MakeRequest(700 + round, 40, 3000), absl::Seconds(60));
    ASSERT_GE(s.ReadTokens(5), 5);
    const absl::Time fault = absl::Now();
    d->process->Signal(sig);
    const Outcome o = s.Finish();
    const absl::Duration answered = absl::Now() - fault;
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE) << o.status.error_message();
    EXPECT_LT(o.tokens.size(), 3000u);
    EXPECT_LT(answered, absl::Seconds(10));
    std::printf("D %s mid-stream: client answered %s after the fault\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP", absl::FormatDuration(answered).c_str());
    if (sig == SIGSTOP) {
      d->process->Signal(SIGCONT);
      const absl::Time resumed = absl::Now();
      ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(10)).ok());
      std::printf("  D whole %s after SIGCONT\n",
                  absl::FormatDuration(absl::Now() - resumed).c_str());
      EXPECT_LE(absl::Now() - resumed, absl::Seconds(2));
      ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(15)).ok()) << cluster->Logs();
    } else {
      ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(2)).ok()) << "P holds nothing";
      RestartAndRebase(*cluster, leaks, "decode-0", SIGKILL);
    }
    ExpectServes(*cluster, 800 + round);
    ExpectNothingLost(*cluster, leaks);
  }
}

TEST(FaultTest, KillDecodeMidStream) { StopOrKillDecodeMidStream(SIGKILL); }
TEST(FaultTest, StopDecodeMidStream) { StopOrKillDecodeMidStream(SIGSTOP); }

// kill -9 of the router mid-stream: the client gets UNAVAILABLE at once; the workers see their
// caller gone and free everything; a router restarted on the same port gets both workers back
// (their heartbeats come back unknown, they register again) and serves.
TEST(FaultTest, KillRouterMidStreamAndRestartIt) {
  auto cluster = StartFaultCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  LeakCheck leaks(*cluster);
  for (int round = 0; round < Iterations(2, 10); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    Stream s(cluster->router(), MakeRequest(900 + round, 40, 3000), absl::Seconds(60));
    ASSERT_GE(s.ReadTokens(5), 5);
    const absl::Time fault = absl::Now();
    cluster->router_process().Signal(SIGKILL);
    const Outcome o = s.Finish();
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE) << o.status.error_message();
    EXPECT_LT(absl::Now() - fault, absl::Seconds(5));
    absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(*cluster, absl::Seconds(2));
    EXPECT_TRUE(whole.ok()) << "workers still hold the dead router's request: " << whole.status();
    // While no router runs, a client is refused (bounded), not left hanging.
    Outcome none = RunRequest(cluster->router(), MakeRequest(1, 10, 2), absl::Seconds(5));
    EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << none.status.error_message();
    const absl::Time restart = absl::Now();
    ASSERT_TRUE(cluster->RestartRouter(SIGKILL).ok()) << cluster->Logs();
    ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(30)).ok()) << cluster->Logs();
    std::printf(
        "router SIGKILL mid-stream: pools whole %s after; both workers re-registered %s "
        "after the restart\n",
        whole.ok() ? absl::FormatDuration(*whole).c_str() : "never",
        absl::FormatDuration(absl::Now() - restart).c_str());
    WarmUp(*cluster, 8, 4);
    leaks.Rebase(*cluster, "router");
    ExpectServes(*cluster, 950 + round);
    ExpectNothingLost(*cluster, leaks);
  }
}

// SIGSTOP of the router mid-stream: clients with a deadline get DEADLINE_EXCEEDED (never a
// hang), new ones too; after SIGCONT the router finds its client gone, the workers free the
// request, and it serves again.
TEST(FaultTest, StopRouterMidStream) {
  auto cluster = StartFaultCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);
  for (int round = 0; round < Iterations(1, 5); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    Stream s(cluster->router(), MakeRequest(990 + round, 40, 3000), absl::Seconds(3));
    ASSERT_GE(s.ReadTokens(5), 5);
    cluster->router_process().Signal(SIGSTOP);
    const Outcome o = s.Finish();
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << o.status.error_message();
    EXPECT_LT(o.took, absl::Seconds(5));
    Outcome stuck = RunRequest(cluster->router(), MakeRequest(2, 10, 2), absl::Seconds(1));
    EXPECT_EQ(stuck.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << stuck.status.error_message();
    cluster->router_process().Signal(SIGCONT);
    const absl::Time resumed = absl::Now();
    ASSERT_TRUE(WaitPoolsWhole(*cluster, absl::Seconds(10)).ok());
    std::printf(
        "router SIGSTOP mid-stream: client DEADLINE_EXCEEDED after %s; pools whole %s "
        "after SIGCONT\n",
        absl::FormatDuration(o.took).c_str(), absl::FormatDuration(absl::Now() - resumed).c_str());
    EXPECT_LE(absl::Now() - resumed, absl::Seconds(2));
    ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(15)).ok()) << cluster->Logs();
    ExpectServes(*cluster, 995 + round);
    ExpectNothingLost(*cluster, leaks);
  }
}

}  // namespace
}  // namespace tandem::reliability
