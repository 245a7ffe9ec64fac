// Disaggregated serving end to end, every component a real process on loopback: tandem_router,
// tandem_worker --role=prefill / decode / mixed (CPU backend, a golden fixture model from
// Hugging Face transformers), KV moving over UCX between the worker processes.
//
// Expected tokens come from the same model run in-process by the engine (what a mixed worker
// runs), and one test compares against a real mixed worker behind its own router.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

// Waits until every block of every live worker is free and nothing is leased.
void ExpectPoolsWhole(Cluster& cluster) {
  for (WorkerHandle& w : cluster.workers()) {
    if (!w.process->Running()) continue;
    tandem::v1::WorkerLoad load;
    for (int i = 0; i < 300; ++i) {
      auto stats = cluster.Stats(w.id);
      ASSERT_TRUE(stats.ok()) << stats.status();
      load = stats->load();
      if (load.kv_blocks_free() == load.kv_blocks_total() && load.kv_blocks_leased() == 0) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total()) << w.id;
    EXPECT_EQ(load.kv_blocks_leased(), 0u) << w.id;
  }
}

TEST(ServingE2eTest, OnePOneDAndTwoPTwoDEqualAMixedWorker) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 10);
  const auto expected = Reference(prompts);
  std::map<std::string, std::vector<Result>> results;
  for (auto [name, p, d, m] : {std::tuple<const char*, int, int, int>{"mixed", 0, 0, 1},
                               {"1P1D", 1, 1, 0},
                               {"2P2D", 2, 2, 0}}) {
    auto cluster = StartCluster(p, d, m);
    ASSERT_NE(cluster, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i) {
      Result r = Generate(cluster->router(), ToRequest(prompts[i]));
      ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message() << cluster->Logs();
      EXPECT_EQ(r.tokens, expected[i]) << name << " prompt " << i;
      EXPECT_EQ(r.finish, tandem::v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(r.usage.prompt_tokens(), prompts[i].ids.size());
      EXPECT_EQ(r.usage.completion_tokens(), static_cast<uint32_t>(prompts[i].max_tokens));
    }
    ExpectPoolsWhole(*cluster);
    if (p > 0) {
      uint64_t received = 0, loads = 0, load_micros = 0;
      for (WorkerHandle& w : cluster->workers()) {
        auto stats = cluster->Stats(w.id);
        ASSERT_TRUE(stats.ok()) << stats.status();
        received += stats->kv_bytes_received();
        loads += stats->kv_loads_completed();
        load_micros += stats->kv_load_micros();
      }
      EXPECT_GT(received, 0u) << name << ": decode workers loaded KV over UCX";
      EXPECT_GT(loads, 0u) << name;
      EXPECT_GT(load_micros, 0u) << name << ": load time is counted";
    }
  }
}

TEST(ServingE2eTest, SixtyFourConcurrentRequestsAllComplete) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 64, 120);
  const auto expected = Reference(prompts);
  auto cluster = StartCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  std::vector<Result> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(cluster->router(), ToRequest(prompts[i]), absl::Seconds(120));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, expected[i]) << "prompt " << i;
  }
  ExpectPoolsWhole(*cluster);
}

TEST(ServingE2eTest, RepeatedPrefixHitsPrefillCache) {
  auto cluster = StartCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Prompt p;
  for (int i = 0; i < 70; ++i) p.ids.push_back(3 + rng() % 500);
  p.max_tokens = 4;
  Result first = Generate(cluster->router(), ToRequest(p));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  Result second = Generate(cluster->router(), ToRequest(p));
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(first.tokens, second.tokens);
  auto stats = cluster->Stats("prefill-0");
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->prefix_cache_hit_tokens(), 64u) << "4 full blocks of the repeated prompt";
  EXPECT_GE(second.usage.cached_prompt_tokens(), 64u);
}

TEST(ServingE2eTest, CancelMidStreamFreesBlocksOnPrefillAndDecode) {
  auto cluster = StartCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  Prompt p;
  for (int i = 0; i < 40; ++i) p.ids.push_back(10 + i);
  p.max_tokens = 400;
  grpc::ClientContext ctx;
  auto reader = cluster->router().Generate(&ctx, ToRequest(p));
  tandem::v1::GenerateResponse msg;
  int got = 0;
  while (got < 3 && reader->Read(&msg)) got += msg.token_ids_size();
  ASSERT_GE(got, 3);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectPoolsWhole(*cluster);
  auto stats = cluster->Stats("decode-0");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->load().num_running(), 0u);
}

// kill -9 of the worker serving a stream: the client gets UNAVAILABLE quickly, the router marks
// the worker unhealthy and sends new requests to the survivor. A 100M-parameter random model
// decodes slowly enough (tens of tokens/s here) that the stream is surely still running.
void KillMidStream(const std::string& role, int prefill, int decode) {
  std::unique_ptr<Cluster> cluster = StartSlowCluster(prefill, decode, 0);
  ASSERT_NE(cluster, nullptr);
  const Prompt p = LongPrompt();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = cluster->router().Generate(&ctx, ToRequest(p));
  tandem::v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(reader->Read(&msg));  // decoding has started on some D
  // The victim: the decode worker running the stream, or the prefill worker that served it.
  WorkerHandle* w = nullptr;
  for (WorkerHandle& cand : cluster->workers()) {
    if (cand.role != role) continue;
    auto stats = cluster->Stats(cand.id);
    ASSERT_TRUE(stats.ok());
    const bool busy =
        role == "decode" ? stats->load().num_running() > 0 : stats->leases_granted() > 0;
    if (busy) w = &cand;
  }
  ASSERT_NE(w, nullptr) << "no " << role << " worker is serving the request";
  const absl::Time killed = absl::Now();
  w->process->Signal(SIGKILL);
  w->process->Wait(absl::Seconds(5));
  const bool killing_decode = role == "decode";
  if (killing_decode) {
    while (reader->Read(&msg)) {
    }
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_LT(absl::Now() - killed, absl::Seconds(10)) << "error must come within seconds";
  } else {
    // D loaded the KV before it streamed, so losing P does not stop this stream.
    int more = 0;
    while (more < 3 && reader->Read(&msg)) more += msg.token_ids_size();
    EXPECT_GE(more, 3) << "the stream goes on without P";
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    reader->Finish();
  }
  // The router notices (failed call or missed heartbeats) and routes around the dead worker.
  ASSERT_TRUE(cluster->WaitHealthy(prefill + decode - 1, absl::Seconds(15)).ok());
  for (int i = 0; i < 4; ++i) {
    Prompt q;
    for (int t = 0; t < 20 + i; ++t) q.ids.push_back(5 + t * 3);
    q.max_tokens = 5;
    Result r = Generate(cluster->router(), ToRequest(q), absl::Seconds(20));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 5u);
  }
}

TEST(ServingE2eTest, KillDecodeMidStream) { KillMidStream("decode", 1, 2); }
TEST(ServingE2eTest, KillPrefillIsRoutedAround) { KillMidStream("prefill", 2, 1); }

// Continuous batching across processes: while a long request decodes, a new request is
// admitted in the next step of P and of D (or of the mixed worker), so it finishes long before
// the first one would. The first stream must still be running when the second ends (the old
// starvation held the second until the running batch drained).
void NewRequestOvertakesALongOne(int prefill, int decode, int mixed) {
  // Tens of tokens/s: 1000 tokens take many seconds.
  std::unique_ptr<Cluster> cluster = StartSlowCluster(prefill, decode, mixed, {"--num_threads=1"});
  ASSERT_NE(cluster, nullptr);
  Prompt long_prompt;
  for (int i = 0; i < 30; ++i) long_prompt.ids.push_back(20 + i);
  long_prompt.max_tokens = 1000;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto reader = cluster->router().Generate(&ctx, ToRequest(long_prompt));
  tandem::v1::GenerateResponse msg;
  int long_tokens = 0;
  while (long_tokens < 3 && reader->Read(&msg)) long_tokens += msg.token_ids_size();
  ASSERT_GE(long_tokens, 3) << "the long request is decoding";

  for (int i = 0; i < 3; ++i) {
    Prompt q;
    for (int t = 0; t < 24; ++t) q.ids.push_back(7 + t * 5 + i);
    q.max_tokens = 4;
    Result r = Generate(cluster->router(), ToRequest(q), absl::Seconds(60));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 4u);
    EXPECT_EQ(r.finish, tandem::v1::FINISH_REASON_LENGTH);
  }
  // The long request is still streaming: the short ones did not wait for it.
  ASSERT_TRUE(reader->Read(&msg)) << "the long request ended first";
  EXPECT_EQ(msg.finish_reason(), tandem::v1::FINISH_REASON_UNSPECIFIED);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(ServingE2eTest, NewRequestOvertakesALongOneOnAMixedWorker) {
  NewRequestOvertakesALongOne(0, 0, 1);
}
TEST(ServingE2eTest, NewRequestOvertakesALongOneThroughPrefillAndDecode) {
  NewRequestOvertakesALongOne(1, 1, 0);
}

// A decode worker restarted on its own address (kill -9, then the same flags: a new process
// and epoch) while streams to it are breaking. The router once died here (SIGSEGV in
// grpc_completion_queue_next or "ref_counted.h: prior > 0", 3 of 4 tries); every user's stream
// with it. Each restart has streams in flight (asserted); they end UNAVAILABLE; the router stays
// up and serves through the restarted worker. 10 restarts; TANDEM_LONG=1: 100.
TEST(ServingE2eTest, DecodeRestartedOnItsAddressUnderLoadLeavesTheRouterServing) {
  const int restarts = std::getenv("TANDEM_LONG") != nullptr ? 100 : 10;
  std::unique_ptr<Cluster> cluster = StartSlowCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  for (int i = 0; i < restarts; ++i) {
    SCOPED_TRACE(testing::Message() << "restart " << i);
    constexpr int kStreams = 3;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>>> readers;
    for (int s = 0; s < kStreams; ++s) {
      Prompt p;
      for (int t = 0; t < 20; ++t) p.ids.push_back(30 + 7 * t + s + 3 * i);
      p.max_tokens = 2000;
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      readers.push_back(cluster->router().Generate(contexts.back().get(), ToRequest(p)));
    }
    for (auto& reader : readers) {
      tandem::v1::GenerateResponse msg;
      int got = 0;
      while (got < 2 && reader->Read(&msg)) got += msg.token_ids_size();
      ASSERT_GE(got, 2) << "stream not decoding before the restart";
    }
    ASSERT_TRUE(cluster->RestartWorker("decode-0", SIGKILL).ok());
    for (auto& reader : readers) {
      tandem::v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
      }
      const grpc::Status status = reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    }
    ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(30)).ok()) << cluster->Logs();
    Prompt q;
    for (int t = 0; t < 10; ++t) q.ids.push_back(5 + t + i);
    q.max_tokens = 3;
    Result r = Generate(cluster->router(), ToRequest(q), absl::Seconds(60));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << cluster->Logs();
    EXPECT_EQ(r.tokens.size(), 3u);
  }
}

TEST(ServingE2eTest, SigtermDrainsInFlightRequestsThenExits) {
  auto cluster = StartCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  Prompt p;
  for (int i = 0; i < 25; ++i) p.ids.push_back(30 + i);
  p.max_tokens = 400;
  const auto expected = Reference({p});
  grpc::ClientContext ctx;
  auto reader = cluster->router().Generate(&ctx, ToRequest(p));
  tandem::v1::GenerateResponse msg;
  std::vector<uint32_t> tokens;
  // Past the first token (from P) the stream comes from D: the request is in flight there.
  while (tokens.size() < 3 && reader->Read(&msg)) {
    tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  }
  ASSERT_GE(tokens.size(), 3u);
  WorkerHandle* d = cluster->worker("decode-0");
  d->process->Signal(SIGTERM);
  while (reader->Read(&msg))
    tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, expected[0]) << "the in-flight request finishes whole";
  const int wait_status = d->process->Wait(absl::Seconds(20));
  ASSERT_NE(wait_status, -1) << "worker did not exit after draining";
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  EXPECT_TRUE(cluster->WaitHealthy(1, absl::Seconds(10)).ok()) << "router stops routing to it";
}

TEST(ServingE2eTest, BadInputIsRejectedBeforeAnyWorkerAllocates) {
  auto cluster = StartCluster(1, 1, 0);
  ASSERT_NE(cluster, nullptr);
  tandem::v1::GenerateRequest base;
  for (uint32_t t : {5u, 6u, 7u}) base.add_prompt_token_ids(t);
  base.mutable_sampling()->set_max_tokens(4);
  std::vector<std::pair<std::string, tandem::v1::GenerateRequest>> bad;
  auto r = base;
  r.add_prompt_token_ids(512);  // vocab is 512
  bad.emplace_back("token outside vocab", r);
  r = base;
  r.clear_prompt_token_ids();
  bad.emplace_back("empty prompt", r);
  r = base;
  r.mutable_sampling()->set_max_tokens(600);  // 3 + 600 > 512
  bad.emplace_back("too long", r);
  r = base;
  r.mutable_sampling()->set_max_tokens(0);
  bad.emplace_back("max_tokens 0", r);
  r = base;
  r.mutable_sampling()->set_temperature(-0.5f);
  bad.emplace_back("negative temperature", r);
  r = base;
  r.mutable_sampling()->set_top_p(1.5f);
  bad.emplace_back("top_p > 1", r);
  r = base;
  r.set_request_id(std::string(300, 'x'));
  bad.emplace_back("id too long", r);
  for (const auto& [what, request] : bad) {
    Result res = Generate(cluster->router(), request, absl::Seconds(10));
    EXPECT_EQ(res.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what << ": " << res.status.error_message();
  }
  for (const char* id : {"prefill-0", "decode-0"}) {
    auto stats = cluster->Stats(id);
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->requests_finished() + stats->requests_aborted(), 0u) << id;
    EXPECT_EQ(stats->leases_granted(), 0u) << id;
    EXPECT_EQ(stats->prefix_cache_queried_tokens(), 0u) << id;
  }
}

}  // namespace
}  // namespace tandem::e2e
