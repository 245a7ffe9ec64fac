// End to end through a real router and fake workers over loopback gRPC: streams match the fake
// model token for token, on 1P1D, 2P2D, mixed workers, under 64 concurrent requests; request
// ids; validation rejects bad requests before any worker sees them.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker.h"
#include "router/testing/router_test_util.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

using v1::WORKER_ROLE_DECODE;
using v1::WORKER_ROLE_MIXED;
using v1::WORKER_ROLE_PREFILL;

void ExpectMatchesFake(const StreamResult& r, const v1::GenerateRequest& req,
                       const FakeWorker& worker) {
  ASSERT_TRUE(r.status.ok()) << r.status.error_code() << " " << r.status.error_message();
  const FakeCompletion want =
      FakeGenerate(req, worker.options().vocab_size, worker.options().eos_token_ids);
  EXPECT_EQ(r.tokens, want.tokens);
  EXPECT_EQ(r.finish_reason, want.finish_reason);
  EXPECT_EQ(r.usage.prompt_tokens(), static_cast<uint32_t>(req.prompt_token_ids_size()));
  EXPECT_EQ(r.usage.completion_tokens(), want.tokens.size());
  // The first message carries exactly the first token; only the last one has a finish reason.
  ASSERT_FALSE(r.chunks.empty());
  ASSERT_EQ(r.chunks[0].token_ids_size(), 1);
  for (size_t i = 0; i + 1 < r.chunks.size(); ++i) {
    EXPECT_EQ(r.chunks[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED) << "chunk " << i;
  }
  for (const auto& chunk : r.chunks) EXPECT_EQ(chunk.request_id(), r.request_id);
}

TEST(RouterStreamTest, OnePrefillOneDecodeStreamsTheFakeModel) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  int decodes = 0;
  for (uint32_t max_tokens : {1u, 2u, 7u, 64u}) {
    for (int len : {1, 15, 16, 17, 100}) {
      SCOPED_TRACE(absl::StrCat("max_tokens ", max_tokens, ", prompt ", len));
      v1::GenerateRequest req = MakeRequest(RandomPrompt(rng, len, 1000), max_tokens);
      StreamResult r = h.Generate(req);
      ExpectMatchesFake(r, req, *p);
      EXPECT_EQ(r.finish_reason, v1::FINISH_REASON_LENGTH);
      if (max_tokens > 1) ++decodes;
    }
  }
  EXPECT_EQ(p->counters().prefill, 20);
  // max_tokens = 1 finishes at the first token: no decode call.
  EXPECT_EQ(d->counters().decode, decodes);
  EXPECT_EQ(p->counters().abort + d->counters().abort, 0);
}

TEST(RouterStreamTest, FinishAtFirstTokenSkipsDecode) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL, [](FakeWorkerOptions& o) {
    o.eos_token_ids = {FakeNextToken(42, 1000)};
  });
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.eos_token_ids = {FakeNextToken(42, 1000)};
  });
  // eos at the first token.
  StreamResult eos = h.Generate(MakeRequest({5, 42}, 10));
  ASSERT_TRUE(eos.status.ok()) << eos.status.error_message();
  EXPECT_EQ(eos.tokens, std::vector<uint32_t>{FakeNextToken(42, 1000)});
  EXPECT_EQ(eos.finish_reason, v1::FINISH_REASON_EOS);
  ASSERT_EQ(eos.chunks.size(), 1u);
  // A stop token at the first token.
  v1::GenerateRequest stop = MakeRequest({9, 8}, 10);
  stop.mutable_sampling()->add_stop_token_ids(FakeNextToken(8, 1000));
  StreamResult s = h.Generate(stop);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(s.finish_reason, v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(s.usage.completion_tokens(), 1u);
  EXPECT_EQ(d->counters().decode, 0);
  // ignore_eos goes through: the stream continues past the eos token.
  v1::GenerateRequest ignore = MakeRequest({5, 42}, 5);
  ignore.mutable_sampling()->set_ignore_eos(true);
  ExpectMatchesFake(h.Generate(ignore), ignore, *p);
  EXPECT_EQ(d->counters().decode, 1);
}

TEST(RouterStreamTest, StopTokenMidStream) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  h.AddWorker("d0", WORKER_ROLE_DECODE);
  v1::GenerateRequest req = MakeRequest({3, 1, 4, 1, 5}, 50);
  const FakeCompletion full = FakeGenerate(req, 1000, {});
  req.mutable_sampling()->add_stop_token_ids(full.tokens[4]);
  StreamResult r = h.Generate(req);
  ExpectMatchesFake(r, req, *p);
  EXPECT_EQ(r.finish_reason, v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(r.tokens.size(), 5u);
}

TEST(RouterStreamTest, TwoPrefillTwoDecodeUnder64ConcurrentRequests) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  RouterHarness h;
  std::vector<FakeWorker*> workers = {
      h.AddWorker("p0", WORKER_ROLE_PREFILL), h.AddWorker("p1", WORKER_ROLE_PREFILL),
      h.AddWorker("d0", WORKER_ROLE_DECODE,
                  [](FakeWorkerOptions& o) { o.token_delay = absl::Milliseconds(1); }),
      h.AddWorker("d1", WORKER_ROLE_DECODE,
                  [](FakeWorkerOptions& o) { o.token_delay = absl::Milliseconds(1); })};
  constexpr int kRequests = 64;
  std::vector<v1::GenerateRequest> requests;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(MakeRequest(RandomPrompt(rng, 1 + static_cast<int>(rng() % 80), 1000),
                                   1 + static_cast<uint32_t>(rng() % 40), absl::StrCat("req-", i)));
  }
  std::vector<StreamResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { results[i] = h.Generate(requests[i]); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ExpectMatchesFake(results[i], requests[i], *workers[0]);
    EXPECT_EQ(results[i].request_id, absl::StrCat("req-", i));
  }
  EXPECT_EQ(workers[0]->counters().prefill + workers[1]->counters().prefill, kRequests);
  int want_decodes = 0;
  for (const auto& r : requests) want_decodes += r.sampling().max_tokens() > 1;
  EXPECT_EQ(workers[2]->counters().decode + workers[3]->counters().decode, want_decodes);
  EXPECT_EQ(h.server().requests().size(), 0u);
}

TEST(RouterStreamTest, MixedWorkerServesWholeRequestsWithoutAPair) {
  RouterHarness h;
  FakeWorker* m = h.AddWorker("m0", WORKER_ROLE_MIXED);
  // A prefill worker alone is no pair: the mixed worker serves.
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  v1::GenerateRequest req = MakeRequest({10, 20, 30}, 12);
  StreamResult r = h.Generate(req);
  ExpectMatchesFake(r, req, *m);
  EXPECT_EQ(m->counters().generate, 1);
  EXPECT_EQ(p->counters().prefill, 0);
  // Once a decode worker joins, the pair takes over.
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  ExpectMatchesFake(h.Generate(req), req, *m);
  EXPECT_EQ(m->counters().generate, 1);
  EXPECT_EQ(p->counters().prefill, 1);
  EXPECT_EQ(d->counters().decode, 1);
}

TEST(RouterStreamTest, RequestIds) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL, [](FakeWorkerOptions& o) { o.max_model_len = 100000; });
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.token_delay = absl::Milliseconds(20);
    o.max_model_len = 100000;
  });
  StreamResult mine = h.Generate(MakeRequest({1, 2}, 3, "client-id-1"));
  ASSERT_TRUE(mine.status.ok());
  EXPECT_EQ(mine.request_id, "client-id-1");
  StreamResult a = h.Generate(MakeRequest({1, 2}, 3));
  StreamResult b = h.Generate(MakeRequest({1, 2}, 3));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_FALSE(a.request_id.empty());
  EXPECT_NE(a.request_id, b.request_id);
  // The same id while the first is in flight: ALREADY_EXISTS; afterwards it is free again.
  grpc::ClientContext ctx;
  auto reader = h.stub().Generate(&ctx, MakeRequest({1, 2}, 50000, "busy"));
  v1::GenerateResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk)) << reader->Finish().error_message();
  while (d->open_streams() == 0) absl::SleepFor(absl::Milliseconds(1));
  const int calls = d->total_calls();
  StreamResult dup = h.Generate(MakeRequest({1, 2}, 3, "busy"));
  EXPECT_EQ(dup.status.error_code(), grpc::StatusCode::ALREADY_EXISTS)
      << dup.status.error_message();
  EXPECT_EQ(d->total_calls(), calls);
  ctx.TryCancel();
  while (reader->Read(&chunk)) {
  }
  reader->Finish();
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (h.server().requests().size() > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(h.Generate(MakeRequest({1, 2}, 3, "busy")).status.ok());
}

TEST(RouterStreamTest, InvalidRequestsNeverReachAWorker) {
  RouterHarness h;
  FakeWorker* p = h.AddWorker("p0", WORKER_ROLE_PREFILL, [](FakeWorkerOptions& o) {
    o.vocab_size = 500;
    o.max_model_len = 64;
  });
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.vocab_size = 500;
    o.max_model_len = 64;
  });
  FakeWorker* m = h.AddWorker("m0", WORKER_ROLE_MIXED);
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> edit;
    std::string message;  // expected substring
  };
  const std::vector<Case> cases = {
      {"empty prompt", [](auto& r) { r.clear_prompt_token_ids(); }, "empty"},
      {"token = vocab", [](auto& r) { r.add_prompt_token_ids(500); }, "prompt_token_ids[3] = 500"},
      {"huge token", [](auto& r) { r.set_prompt_token_ids(0, 0xFFFFFFFFu); }, "vocabulary"},
      {"too long", [](auto& r) { r.mutable_sampling()->set_max_tokens(62); }, "max length 64"},
      {"max_tokens 0", [](auto& r) { r.mutable_sampling()->set_max_tokens(0); }, "max_tokens"},
      {"temperature < 0", [](auto& r) { r.mutable_sampling()->set_temperature(-0.5f); },
       "temperature"},
      {"temperature NaN", [](auto& r) { r.mutable_sampling()->set_temperature(std::nanf("")); },
       "temperature"},
      {"temperature > max",
       [](auto& r) { r.mutable_sampling()->set_temperature(v1::kMaxTemperature * 1.01f); },
       "temperature"},
      {"top_p > 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {"top_p < 0", [](auto& r) { r.mutable_sampling()->set_top_p(-0.1f); }, "top_p"},
      {"too many stops",
       [](auto& r) {
         for (int i = 0; i <= v1::kMaxStopTokenIds; ++i)
           r.mutable_sampling()->add_stop_token_ids(1);
       },
       "stop_token_ids"},
      {"stop id = vocab", [](auto& r) { r.mutable_sampling()->add_stop_token_ids(500); },
       "stop_token_ids[0]"},
      {"long id", [](auto& r) { r.set_request_id(std::string(v1::kMaxIdBytes + 1, 'x')); },
       "request_id"},
      {"long salt", [](auto& r) { r.set_cache_salt(std::string(v1::kMaxIdBytes + 1, 's')); },
       "cache_salt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest req = MakeRequest({1, 2, 3}, 4);
    c.edit(req);
    StreamResult r = h.Generate(req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.message), std::string::npos)
        << r.status.error_message();
    EXPECT_TRUE(r.chunks.empty());
  }
  EXPECT_EQ(p->total_calls() + d->total_calls() + m->total_calls(), 0);
  // The limits at their edge pass.
  v1::GenerateRequest edge = MakeRequest({499, 0, 1}, 61);
  edge.mutable_sampling()->set_temperature(v1::kMaxTemperature);
  edge.mutable_sampling()->set_top_p(1.0f);
  edge.set_request_id(std::string(v1::kMaxIdBytes, 'i'));
  EXPECT_TRUE(h.Generate(edge).status.ok());
}

TEST(RouterStreamTest, NoWorkersIsUnavailable) {
  RouterHarness h;
  StreamResult r = h.Generate(MakeRequest({1}, 1));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.status.error_message().find("no workers"), std::string::npos);
  // Validation still comes first.
  EXPECT_EQ(h.Generate(MakeRequest({}, 1)).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext ctx;
  v1::HealthResponse health;
  ASSERT_TRUE(h.stub().Health(&ctx, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_NOT_SERVING);
  // A lone decode worker is no route either.
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  EXPECT_EQ(h.Generate(MakeRequest({1}, 1)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(d->total_calls(), 0);
}

TEST(RouterStreamTest, ListWorkersAndHealth) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", WORKER_ROLE_DECODE);
  d->SetLoad(Load(3, 4, 1234));
  h.SyncHeartbeats();
  std::vector<v1::WorkerEntry> workers = h.Workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].info().worker_id(), "d0");
  EXPECT_EQ(workers[0].info().role(), WORKER_ROLE_DECODE);
  EXPECT_EQ(workers[0].load().num_running(), 3u);
  EXPECT_EQ(workers[0].load().kv_blocks_free(), 1234u);
  EXPECT_EQ(workers[0].info().address(), d->address());
  EXPECT_TRUE(workers[0].healthy());
  EXPECT_EQ(workers[0].status(), v1::SERVING_STATUS_SERVING);
  EXPECT_GT(workers[0].last_heartbeat_unix_ms(), 0);
  EXPECT_EQ(workers[1].info().worker_id(), "p0");
  grpc::ClientContext ctx;
  v1::HealthResponse health;
  ASSERT_TRUE(h.stub().Health(&ctx, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_SERVING) << health.detail();
}

}  // namespace
}  // namespace tandem::router
