// Bad input of every kind against a real router + P + D (tests/reliability/README.md):
//   * every GenerateRequest field out of range (a table): INVALID_ARGUMENT naming the field at
//     the router, and the same when the worker is called directly; edge values that are legal
//     are served;
//   * malformed protobuf bytes on every gRPC method of every daemon (INVALID_ARGUMENT, "malformed
//     request"), oversize messages, and raw TCP garbage on every port a daemon listens on (gRPC,
//     HTTP metrics, UCX);
//   * a connection flood past each daemon's descriptor limit: every port serves again after;
//   * unknown and duplicate request ids.
// Each case ends with the cluster serving, every KV pool whole and no thread or fd leaked.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tandem/v1/kv.grpc.pb.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/reliability/raw_wire.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

using tandem::v1::GenerateRequest;

constexpr int kMaxModelLen = 1024;  // --max_model_len of the workers

std::unique_ptr<Cluster> StartBadInputCluster() {
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  options.worker_flags = {absl::StrCat("--max_model_len=", kMaxModelLen),
                          "--metrics_listen=127.0.0.1:0"};
  options.router_flags = {"--metrics_listen=127.0.0.1:0"};
  options.extra_worker_certs = {kRawWorkerCert};  // the registry barrage speaks as raw-worker
  return Start(options);
}

// What a worker did, summed over workers: must not move while bad requests are refused.
uint64_t WorkerActivity(Cluster& cluster) {
  uint64_t sum = 0;
  for (e2e::WorkerHandle& w : cluster.workers()) {
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(w.id);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) continue;
    sum += s->requests_finished() + s->requests_aborted() + s->leases_granted() +
           s->prefix_cache_queried_tokens();
  }
  return sum;
}

void ExpectServes(Cluster& cluster, uint32_t seed) {
  Outcome o = RunRequest(cluster.router(), MakeRequest(seed, 24, 6), absl::Seconds(30));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message() << cluster.Logs();
  EXPECT_EQ(o.tokens.size(), 6u);
}

struct BadCase {
  std::string what;
  std::function<void(GenerateRequest&)> mutate;
  grpc::StatusCode code;  // OK: a legal edge value, served
  std::string message;    // the status message names this
};

std::vector<BadCase> BadCases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto kIA = grpc::StatusCode::INVALID_ARGUMENT;
  const auto kOK = grpc::StatusCode::OK;
  auto prompt = [](int n) {
    return [n](GenerateRequest& r) {
      r.clear_prompt_token_ids();
      for (int i = 0; i < n; ++i) r.add_prompt_token_ids(3 + i % 1000);
    };
  };
  return {
      {"empty prompt", [](GenerateRequest& r) { r.clear_prompt_token_ids(); }, kIA,
       "prompt_token_ids is empty"},
      {"token id = vocab size", [](GenerateRequest& r) { r.add_prompt_token_ids(kSmallVocab); },
       kIA, "vocabulary"},
      {"token id 2^32-1", [](GenerateRequest& r) { r.add_prompt_token_ids(UINT32_MAX); }, kIA,
       "vocabulary"},
      {"max_tokens 0", [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(0); }, kIA,
       "max_tokens"},
      {"max_tokens -1 (2^32-1 as uint32)",
       [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(UINT32_MAX); }, kIA,
       "max length"},
      {"max_tokens 10^9",
       [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(1000000000); }, kIA,
       "max length"},
      {"prompt + max_tokens = max_model_len + 1",
       [](GenerateRequest& r) {
         r.mutable_sampling()->set_max_tokens(kMaxModelLen + 1 - r.prompt_token_ids_size());
       },
       kIA, "max length"},
      {"prompt of max_model_len + 1 tokens", prompt(kMaxModelLen + 1), kIA, "max length"},
      {"prompt over the wire limit (2^20 + 1 tokens)", prompt(v1::kMaxPromptTokens + 1), kIA,
       "limit is 1048576"},
      {"temperature -0.5", [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-0.5f); },
       kIA, "temperature"},
      {"temperature NaN", [nan](GenerateRequest& r) { r.mutable_sampling()->set_temperature(nan); },
       kIA, "temperature"},
      {"temperature +inf",
       [inf](GenerateRequest& r) { r.mutable_sampling()->set_temperature(inf); }, kIA,
       "temperature"},
      {"temperature 100.5",
       [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(100.5f); }, kIA,
       "temperature"},
      {"top_p 1.5", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }, kIA,
       "top_p"},
      {"top_p -0.1", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(-0.1f); }, kIA,
       "top_p"},
      {"top_p NaN", [nan](GenerateRequest& r) { r.mutable_sampling()->set_top_p(nan); }, kIA,
       "top_p"},
      {"65 stop_token_ids",
       [](GenerateRequest& r) {
         for (int i = 0; i < v1::kMaxStopTokenIds + 1; ++i) {
           r.mutable_sampling()->add_stop_token_ids(100 + i);
         }
       },
       kIA, "stop_token_ids"},
      {"stop token id = vocab size",
       [](GenerateRequest& r) { r.mutable_sampling()->add_stop_token_ids(kSmallVocab); }, kIA,
       "stop_token_ids"},
      {"stop token id 2^32-1",
       [](GenerateRequest& r) { r.mutable_sampling()->add_stop_token_ids(UINT32_MAX); }, kIA,
       "stop_token_ids"},
      {"request_id of 129 bytes",
       [](GenerateRequest& r) { r.set_request_id(std::string(129, 'i')); }, kIA, "request_id"},
      {"cache_salt of 129 bytes",
       [](GenerateRequest& r) { r.set_cache_salt(std::string(129, 's')); }, kIA, "cache_salt"},
      {"no sampling message (max_tokens 0)", [](GenerateRequest& r) { r.clear_sampling(); }, kIA,
       "max_tokens"},
      // Legal edges: served.
      {"prompt + max_tokens = max_model_len",
       [](GenerateRequest& r) {
         r.mutable_sampling()->set_max_tokens(kMaxModelLen - r.prompt_token_ids_size());
       },
       kOK, ""},
      {"token id = vocab size - 1",
       [](GenerateRequest& r) { r.add_prompt_token_ids(kSmallVocab - 1); }, kOK, ""},
      {"top_k 2^32-1 (above the vocab: off)",
       [](GenerateRequest& r) { r.mutable_sampling()->set_top_k(UINT32_MAX); }, kOK, ""},
      {"temperature 100 with top_p 0 (off) and seed 2^64-1",
       [](GenerateRequest& r) {
         r.mutable_sampling()->set_temperature(100.0f);
         r.mutable_sampling()->set_seed(UINT64_MAX);
       },
       kOK, ""},
      {"64 stop_token_ids",
       [](GenerateRequest& r) {
         for (int i = 0; i < v1::kMaxStopTokenIds; ++i) r.mutable_sampling()->add_stop_token_ids(i);
       },
       kOK, ""},
      {"request_id and cache_salt of 128 bytes",
       [](GenerateRequest& r) {
         r.set_request_id(std::string(128, 'i'));
         r.set_cache_salt(std::string(128, 's'));
       },
       kOK, ""},
  };
}

TEST(BadInputTest, EveryFieldOutOfRangeIsRefusedNamingItAndNothingIsLost) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);
  e2e::WorkerHandle* prefill = cluster->worker("prefill-0");
  ASSERT_NE(prefill, nullptr);
  // The prefill worker as the router reaches it (router certificate).
  auto direct_stub = v1::WorkerService::NewStub(Connect(*cluster, prefill->address, "router"));
  int n = 0;
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.what);
    GenerateRequest r = MakeRequest(static_cast<uint32_t>(n++), 16, 8);
    c.mutate(r);
    const uint64_t before = WorkerActivity(*cluster);
    Outcome o = RunRequest(cluster->router(), r, absl::Seconds(30));
    EXPECT_EQ(o.status.error_code(), c.code) << o.status.error_message();
    if (c.code != grpc::StatusCode::OK) {
      EXPECT_NE(o.status.error_message().find(c.message), std::string::npos)
          << "message does not name '" << c.message << "': " << o.status.error_message();
      EXPECT_TRUE(o.tokens.empty());
      EXPECT_EQ(WorkerActivity(*cluster), before) << "a worker saw a refused request";
      // Called directly (as a peer could), the prefill worker refuses it as well.
      v1::PrefillRequest direct;
      *direct.mutable_request() = r;
      if (direct.request().request_id().empty()) direct.mutable_request()->set_request_id("direct");
      direct.set_remote_decode(true);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      v1::PrefillResponse reply;
      const grpc::Status s = direct_stub->Prefill(&ctx, direct, &reply);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << "worker: " << s.error_message();
    } else {
      EXPECT_FALSE(o.tokens.empty());
      EXPECT_LE(o.tokens.size(), r.sampling().max_tokens());
    }
  }
  ExpectServes(*cluster, 77);
  ExpectNothingLost(*cluster, leaks);
}

// Sends every malformed payload to every method `daemon` serves (at `address`; the router's
// WorkerRegistry on its internal port), with the credentials the method's callers have.
void BarrageOf(Cluster& cluster, const std::string& daemon, const std::string& address,
               const std::vector<RawMethod>& methods, std::mt19937& rng,
               std::map<std::string, int>* codes) {
  for (const RawMethod& m : methods) {
    const std::string& to =
        daemon == "router" && !m.cert.empty() ? cluster.internal_address() : address;
    std::shared_ptr<grpc::Channel> channel = Connect(cluster, to, m.cert);
    ASSERT_NE(channel, nullptr);
    for (const Payload& p : MalformedPayloads(m, rng)) {
      SCOPED_TRACE(absl::StrCat(daemon, " ", m.path, ": ", p.what));
      const absl::Time start = absl::Now();
      const grpc::Status s = CallRaw(channel, m.path, p.bytes, absl::Seconds(10));
      EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "no prompt answer";
      EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
      EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << "the test's credentials do not reach the parser: " << s.error_message();
      if (p.malformed) {
        // INVALID_ARGUMENT saying so, on every port and method (common/grpc_strict_parse.h):
        // not gRPC's own INTERNAL ''.
        EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
        EXPECT_NE(s.error_message().find("malformed request"), std::string::npos)
            << s.error_message();
        ++(*codes)[absl::StrCat(s.error_code(), " ", m.path)];
      }
    }
    // A method nobody serves, on the same channel: UNIMPLEMENTED (PERMISSION_DENIED on an
    // internal port, whose policy refuses methods it does not know).
    const grpc::Status s =
        CallRaw(channel, "/tandem.v1.Router/NoSuchMethod", "", absl::Seconds(10));
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
                s.error_code() == grpc::StatusCode::PERMISSION_DENIED)
        << daemon << ": " << s.error_code() << " " << s.error_message();
  }
}

TEST(BadInputTest, MalformedProtobufOnEveryMethodOfEveryDaemon) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::map<std::string, int> codes;
  BarrageOf(*cluster, "router", cluster->router_address(), RouterMethods(), rng, &codes);
  for (e2e::WorkerHandle& w : cluster->workers()) {
    BarrageOf(*cluster, w.id, w.address, WorkerMethods(), rng, &codes);
  }
  // The wire form of a negative max_tokens (int64 -1: ten bytes) reads as 2^32-1.
  std::string negative = MakeRequest(5, 8, 1).SerializeAsString();
  negative += std::string("\x1a\x0b\x08", 3) + std::string(9, '\xff') + "\x01";
  GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(negative));
  ASSERT_EQ(parsed.sampling().max_tokens(), UINT32_MAX);
  const grpc::Status s = CallRaw(Connect(*cluster, cluster->router_address(), ""),
                                 "/tandem.v1.Router/Generate", negative, absl::Seconds(10));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  for (const auto& [code, count] : codes) {
    std::printf("unparseable request -> status %s: %d times\n", code.c_str(), count);
  }
  for (e2e::WorkerHandle& w : cluster->workers()) {
    EXPECT_TRUE(w.process->Running()) << w.id << " died:\n" << w.process->LogTail();
  }
  ASSERT_TRUE(cluster->router_process().Running()) << cluster->router_process().LogTail();
  ExpectServes(*cluster, 78);
  ExpectNothingLost(*cluster, leaks);
}

TEST(BadInputTest, OversizeMessagesAreRefusedOnEveryPort) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);
  // One byte over the limit every server sets (kMaxGrpcMessageBytes), as a valid message: a
  // GenerateRequest whose request_id field is that long (the parser is never reached).
  const std::string big(static_cast<size_t>(v1::kMaxGrpcMessageBytes) + 1, 'x');
  struct Target {
    std::string address, cert, method;
  };
  std::vector<Target> targets = {
      {cluster->router_address(), "", "/tandem.v1.Router/Generate"},
      {cluster->internal_address(), "prefill", "/tandem.v1.WorkerRegistry/Heartbeat"}};
  for (e2e::WorkerHandle& w : cluster->workers()) {
    targets.push_back({w.address, "router", "/tandem.v1.WorkerService/Prefill"});
    targets.push_back({w.address, "router", "/tandem.v1.WorkerService/Decode"});
    targets.push_back({w.address, "decode", "/tandem.v1.KvTransferService/Handshake"});
  }
  for (const Target& t : targets) {
    const grpc::Status s =
        CallRaw(Connect(*cluster, t.address, t.cert), t.method, big, absl::Seconds(20));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << t.address << t.method << ": " << s.error_message();
  }
  ExpectServes(*cluster, 79);
  ExpectNothingLost(*cluster, leaks);
}

// Every TCP port of every daemon (gRPC, the HTTP metrics plane, UCX's listeners) gets bytes
// that are not its protocol: the daemon drops the connection or ignores it, and serves on.
TEST(BadInputTest, RawTcpGarbageOnEveryListeningPort) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::string garbage(4096, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  const std::string h2_then_garbage = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                                      std::string("\x00\x00\x04\x09\xff", 5) +
                                      garbage.substr(0, 512);
  const std::vector<std::pair<std::string, std::string>> payloads = {
      {"nothing", ""},
      {"4 KiB of random bytes", garbage},
      {"HTTP/2 preface then a bad frame", h2_then_garbage},
      {"an HTTP/1 request line", "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"},
  };
  for (const Daemon& d : Daemons(*cluster)) {
    const std::vector<int> ports = ListeningTcpPorts(d.pid);
    EXPECT_FALSE(ports.empty()) << d.name;
    for (int port : ports) {
      for (const auto& [what, bytes] : payloads) {
        const std::string result = SendRawTcp(port, bytes, absl::Milliseconds(300));
        std::printf("%s port %d, %s: %s\n", d.name.c_str(), port, what.c_str(), result.c_str());
      }
    }
  }
  for (e2e::WorkerHandle& w : cluster->workers()) {
    ASSERT_TRUE(w.process->Running()) << w.id << " died:\n" << w.process->LogTail();
  }
  ASSERT_TRUE(cluster->router_process().Running()) << cluster->router_process().LogTail();
  ExpectServes(*cluster, 80);
  ExpectNothingLost(*cluster, leaks);
}

// Opens `n` TCP connections to 127.0.0.1:`port` at once, then closes them all.
void FloodThenClose(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));  // the daemon accepts until it runs out
  for (int fd : fds) close(fd);
}

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A connection flood past a daemon's descriptor limit (accept() fails with EMFILE) loses no
// port: with each daemon's limit lowered to what it has open + 24, 64 connections at once on the
// router's public and internal gRPC ports, its metrics port and each worker's gRPC port; once
// they close, everything serves. Before (H4's probe), gRPC 1.51's listener stopped for good after
// one EMFILE (the router's public port: every later call "timed out before receiving SETTINGS"),
// and so did the HTTP server's (common/grpc_listener.h, common/http/http_server.cc).
TEST(BadInputTest, AConnectionFloodPastTheDescriptorLimitLosesNoPort) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 4, 2);
  std::vector<std::pair<pid_t, std::vector<int>>> targets = {
      {cluster->router_process().pid(), ListeningTcpPorts(cluster->router_process().pid())}};
  for (e2e::WorkerHandle& w : cluster->workers()) {
    targets.push_back({w.process->pid(), {PortOf(w.address)}});
  }
  for (const auto& [pid, ports] : targets) {
    absl::StatusOr<ProcFigures> open = ReadProc(pid);
    ASSERT_TRUE(open.ok()) << open.status();
    rlimit saved;
    ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &saved), 0);
    rlimit low = saved;  // the soft limit only: raising a hard one back needs a capability
    low.rlim_cur = static_cast<rlim_t>(open->fds + 24);
    ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0);
    for (int port : ports) FloodThenClose(port, 64);
    ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &saved, nullptr), 0);
  }
  const std::string logs = cluster->Logs();
  EXPECT_NE(logs.find("accept failed (Too many open files)"), std::string::npos)
      << "the flood never reached the descriptor limit";
  for (e2e::WorkerHandle& w : cluster->workers()) {
    ASSERT_TRUE(w.process->Running()) << w.id << " died:\n" << w.process->LogTail();
  }
  ASSERT_TRUE(cluster->router_process().Running()) << cluster->router_process().LogTail();
  ASSERT_TRUE(cluster->WaitHealthy(2, absl::Seconds(10)).ok()) << "the internal port is lost";
  ExpectServes(*cluster, 90);  // public port, P and D ports
  ExpectServes(*cluster, 91);
  EXPECT_TRUE(WaitPoolsWhole(*cluster).ok());
}

TEST(BadInputTest, UnknownAndDuplicateRequestIds) {
  auto cluster = StartBadInputCluster();
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster);
  const LeakCheck leaks(*cluster);

  // Unknown ids: nothing found, nothing disturbed.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::AbortRequest req;
    req.set_request_id("no-such-request");
    v1::AbortResponse resp;
    ASSERT_TRUE(cluster->router().Abort(&ctx, req, &resp).ok());
    EXPECT_FALSE(resp.found());
  }
  for (e2e::WorkerHandle& w : cluster->workers()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::AbortRequest req;
    req.set_request_id("no-such-request");
    v1::AbortResponse resp;
    auto as_router = v1::WorkerService::NewStub(Connect(*cluster, w.address, "router"));
    ASSERT_TRUE(as_router->Abort(&ctx, req, &resp).ok()) << w.id;
    EXPECT_FALSE(resp.found()) << w.id;
  }
  {
    absl::StatusOr<v1::WorkerStats> p = cluster->Stats("prefill-0");
    ASSERT_TRUE(p.ok());
    auto kv = v1::KvTransferService::NewStub(
        Connect(*cluster, cluster->worker("prefill-0")->address, "decode"));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ReleaseLeaseRequest release;
    release.set_worker_id("prefill-0");
    release.set_epoch(p->info().epoch());
    release.set_lease_id(0x1234567890abcdefULL);
    v1::ReleaseLeaseResponse released;
    const grpc::Status s = kv->ReleaseLease(&ctx, release, &released);
    EXPECT_FALSE(s.ok() && released.released()) << "an unknown lease was released";
  }

  // A duplicate id while the first stream runs: ALREADY_EXISTS; the first completes whole.
  GenerateRequest first = MakeRequest(42, 40, 950);
  first.set_request_id("dup-id");
  Stream a(cluster->router(), first, absl::Seconds(60));
  ASSERT_GE(a.ReadTokens(2), 2) << a.Finish().status.error_message();
  for (int i = 0; i < 3; ++i) {
    GenerateRequest again = MakeRequest(43 + i, 20, 4);
    again.set_request_id("dup-id");
    Outcome dup = RunRequest(cluster->router(), again, absl::Seconds(10));
    EXPECT_EQ(dup.status.error_code(), grpc::StatusCode::ALREADY_EXISTS)
        << dup.status.error_message();
    EXPECT_NE(dup.status.error_message().find("dup-id"), std::string::npos)
        << dup.status.error_message();
  }
  Outcome whole = a.Finish();
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  EXPECT_EQ(whole.tokens.size(), 950u);
  // Reused once the first is done: the same tokens (greedy).
  Outcome reused = RunRequest(cluster->router(), first, absl::Seconds(60));
  ASSERT_TRUE(reused.status.ok()) << reused.status.error_message();
  EXPECT_EQ(reused.tokens, whole.tokens);

  // Two streams racing for one id: exactly one is admitted.
  for (int race = 0; race < 5; ++race) {
    GenerateRequest r = MakeRequest(60 + race, 30, 300);
    r.set_request_id(absl::StrCat("race-", race));
    Outcome o1, o2;
    std::thread t1([&] { o1 = RunRequest(cluster->router(), r, absl::Seconds(30)); });
    std::thread t2([&] { o2 = RunRequest(cluster->router(), r, absl::Seconds(30)); });
    t1.join();
    t2.join();
    const int ok = (o1.status.ok() ? 1 : 0) + (o2.status.ok() ? 1 : 0);
    const int dup = (o1.status.error_code() == grpc::StatusCode::ALREADY_EXISTS ? 1 : 0) +
                    (o2.status.error_code() == grpc::StatusCode::ALREADY_EXISTS ? 1 : 0);
    // Both OK only when the first ended before the second arrived (then the id was free).
    EXPECT_TRUE((ok == 1 && dup == 1) || ok == 2)
        << o1.status.error_message() << " / " << o2.status.error_message();
  }

  // Router.Abort of a running stream: it ends OK with FINISH_REASON_ABORTED.
  GenerateRequest victim = MakeRequest(90, 40, 950);
  victim.set_request_id("abort-me");
  Stream v(cluster->router(), victim, absl::Seconds(60));
  ASSERT_GE(v.ReadTokens(2), 2) << v.Finish().status.error_message();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::AbortRequest req;
    req.set_request_id("abort-me");
    v1::AbortResponse resp;
    ASSERT_TRUE(cluster->router().Abort(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.found());
  }
  Outcome aborted = v.Finish();
  EXPECT_TRUE(aborted.status.ok()) << aborted.status.error_message();
  EXPECT_EQ(aborted.finish, v1::FINISH_REASON_ABORTED);
  EXPECT_LT(aborted.tokens.size(), 950u);

  ExpectServes(*cluster, 81);
  ExpectNothingLost(*cluster, leaks);
}

}  // namespace
}  // namespace tandem::reliability
