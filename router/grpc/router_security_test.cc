// The router's planes and authentication against a real tandem_router process with TLS
// (certificates from deploy/certs/make_certs.sh): API keys on the public port, WorkerRegistry
// only on the internal mTLS port and only for worker roles, ListWorkers as an admin call, request
// ids and Router.Abort scoped to the caller's key, workers' WorkerService only for the router.
// Worker identity (issue 30 items 3, 4): a worker id is registered and heartbeaten only with the
// certificate naming it; the role-only decode.pem / prefill.pem neither take over a live worker
// (even with epoch 2^64-1) nor drain one.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/security/grpc_security.h"
#include "common/security/test_certs.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

using security::MakeTestCerts;
using security::SecurityConfig;
using security::TestCerts;

constexpr char kAlice[] = "sk-alice-0123456789abcdef";
constexpr char kBob[] = "sk-bob-0123456789abcdef";
constexpr char kOps[] = "sk-ops-0123456789abcdef";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// tandem_router as a child process; SIGKILLed when destroyed.
class RouterProcess {
 public:
  explicit RouterProcess(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~RouterProcess() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
};

std::string WaitForFile(const std::string& path) {
  for (int i = 0; i < 600 && ReadFile(path).empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
  return ReadFile(path);
}

class RouterSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> certs = MakeTestCerts(
        "cluster",
        {"--worker=decode-7:decode", "--worker=prefill-0:prefill", "--worker=decode-0:decode"});
    absl::StatusOr<TestCerts> other = MakeTestCerts("other");
    ASSERT_TRUE(certs.ok() && other.ok());
    certs_ = new TestCerts(*certs);
    other_ = new TestCerts(*other);
    const std::string dir = std::getenv("TEST_TMPDIR");
    std::ofstream(dir + "/keys") << kAlice << " alice\n"
                                 << kBob << " bob\n"
                                 << kOps << " ops admin\n";
    const std::string srcdir = std::getenv("TEST_SRCDIR");
    router_ = new RouterProcess(
        {srcdir + "/tandem/router/tandem_router", "--listen=127.0.0.1:0",
         "--internal_listen=127.0.0.1:0", "--port_file=" + dir + "/public.port",
         "--internal_port_file=" + dir + "/internal.port", "--heartbeat_interval_ms=50",
         "--tls_cert=" + certs_->Pem("router"), "--tls_key=" + certs_->Key("router"),
         "--tls_ca=" + certs_->Ca(), "--api_key_file=" + dir + "/keys"},
        dir + "/router.log");
    public_ = new std::string(WaitForFile(dir + "/public.port"));
    internal_ = new std::string(WaitForFile(dir + "/internal.port"));
    ASSERT_FALSE(public_->empty() || internal_->empty()) << ReadFile(dir + "/router.log");
  }
  static void TearDownTestSuite() { delete router_; }

  // A client of the public port: TLS trusting the CA, no certificate.
  static SecurityConfig PublicClient() {
    SecurityConfig c = certs_->Config("client");
    c.tls.cert_pem.clear();
    c.tls.key_pem.clear();
    return c;
  }
  static std::unique_ptr<v1::Router::Stub> RouterStub(const std::string& address,
                                                      const SecurityConfig& config,
                                                      const std::string& key = "") {
    return v1::Router::NewStub(security::CreateChannelWithApiKey(address, config, key));
  }
  static grpc::Status Health(const std::string& key) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::HealthResponse resp;
    return RouterStub(*public_, PublicClient(), key)->Health(&ctx, v1::HealthRequest(), &resp);
  }
  static grpc::Status ListWorkers(const std::string& address, const SecurityConfig& config,
                                  const std::string& key, v1::ListWorkersResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return RouterStub(address, config, key)->ListWorkers(&ctx, v1::ListWorkersRequest(), resp);
  }
  static grpc::Status Register(const std::string& address, const SecurityConfig& config,
                               v1::WorkerRole role, const std::string& worker_id = "intruder",
                               uint64_t epoch = 1) {
    auto stub = v1::WorkerRegistry::NewStub(security::CreateChannel(address, config));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::RegisterWorkerRequest req;
    req.mutable_info()->set_worker_id(worker_id);
    req.mutable_info()->set_address("127.0.0.1:1");
    req.mutable_info()->set_role(role);
    req.mutable_info()->set_epoch(epoch);
    req.mutable_info()->set_model_id("m");
    req.mutable_info()->set_vocab_size(100);
    req.mutable_info()->set_max_model_len(100);
    req.mutable_info()->set_block_size(16);
    v1::RegisterWorkerResponse resp;
    return stub->RegisterWorker(&ctx, req, &resp);
  }
  // A fake worker registering with its own certificate (named `id`) and, as a daemon does, its
  // start time as the epoch: it replaces the previous test's worker of that id at once.
  std::unique_ptr<FakeWorker> StartWorker(const std::string& id, v1::WorkerRole role,
                                          absl::Duration token_delay) {
    FakeWorkerOptions o;
    o.worker_id = id;
    o.role = role;
    o.epoch = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
    o.router_address = *internal_;
    o.security = certs_->Config(id);
    o.token_delay = token_delay;
    absl::StatusOr<std::unique_ptr<FakeWorker>> w = FakeWorker::Start(o);
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->WaitForHeartbeats(1, absl::Seconds(30))) << id;
    return *std::move(w);
  }
  // The workers ListWorkers (admin) shows; `healthy`: only those.
  static std::map<std::string, v1::WorkerEntry> Workers(bool healthy) {
    v1::ListWorkersResponse list;
    EXPECT_TRUE(ListWorkers(*internal_, certs_->Config("admin"), "", &list).ok());
    std::map<std::string, v1::WorkerEntry> out;
    for (const v1::WorkerEntry& w : list.workers()) {
      if (!healthy || w.healthy()) out[w.info().worker_id()] = w;
    }
    return out;
  }
  // Waits until exactly `ids` are healthy.
  static void WaitForHealthy(const std::set<std::string>& ids) {
    std::set<std::string> now;
    for (int i = 0; i < 300; ++i) {
      now.clear();
      for (const auto& [id, w] : Workers(true)) now.insert(id);
      if (now == ids) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "healthy workers: " << now.size();
  }
  // One request with a random prompt and length from Alice (a client key); its tokens must be
  // the real fake model's (vocabulary 1000).
  static void GenerateAndCheck(std::mt19937& rng) {
    v1::GenerateRequest req;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 20); i < n; ++i) {
      req.add_prompt_token_ids(rng() % 1000);
    }
    req.mutable_sampling()->set_max_tokens(2 + rng() % 8);
    req.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = RouterStub(*public_, PublicClient(), kAlice)->Generate(&ctx, req);
    std::vector<uint32_t> tokens;
    v1::GenerateResponse chunk;
    while (reader->Read(&chunk))
      tokens.insert(tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_EQ(tokens, FakeGenerate(req, 1000, {}).tokens);
  }

  static TestCerts* certs_;
  static TestCerts* other_;
  static RouterProcess* router_;
  static std::string* public_;
  static std::string* internal_;
};
TestCerts* RouterSecurityTest::certs_ = nullptr;
TestCerts* RouterSecurityTest::other_ = nullptr;
RouterProcess* RouterSecurityTest::router_ = nullptr;
std::string* RouterSecurityTest::public_ = nullptr;
std::string* RouterSecurityTest::internal_ = nullptr;

TEST_F(RouterSecurityTest, PublicPortNeedsAValidKey) {
  EXPECT_TRUE(Health(kAlice).ok());
  for (const std::string& key :
       {std::string(), std::string("sk-alice-0123456789abcdeX"), std::string(kAlice) + "x"}) {
    grpc::Status s = Health(key);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    EXPECT_EQ(s.error_message(), "authentication failed") << key;
  }
  // Plain text is not spoken on the TLS port.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::HealthResponse resp;
  EXPECT_EQ(
      RouterStub(*public_, SecurityConfig())->Health(&ctx, v1::HealthRequest(), &resp).error_code(),
      grpc::StatusCode::UNAVAILABLE);
}

TEST_F(RouterSecurityTest, NoInternalRpcOnThePublicPort) {
  // Even a valid worker certificate cannot register through the public port.
  EXPECT_EQ(Register(*public_, certs_->Config("prefill"), v1::WORKER_ROLE_PREFILL).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  v1::ListWorkersResponse list;
  EXPECT_EQ(ListWorkers(*public_, PublicClient(), kAlice, &list).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(ListWorkers(*public_, PublicClient(), kOps, &list).ok());  // an admin key
}

TEST_F(RouterSecurityTest, InternalPortChecksCertificatesAndRoles) {
  v1::ListWorkersResponse list;
  EXPECT_TRUE(ListWorkers(*internal_, certs_->Config("admin"), "", &list).ok());
  for (const char* who : {"prefill", "decode", "mixed", "router", "client"}) {
    grpc::Status s = ListWorkers(*internal_, certs_->Config(who), "", &list);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_EQ(s.error_message(), "permission denied") << who;
  }
  for (const char* who : {"admin", "client", "router"}) {
    EXPECT_EQ(Register(*internal_, certs_->Config(who), v1::WORKER_ROLE_PREFILL).error_code(),
              grpc::StatusCode::PERMISSION_DENIED)
        << who;
  }
  // A prefill certificate may not register a decode worker.
  EXPECT_EQ(Register(*internal_, certs_->Config("prefill"), v1::WORKER_ROLE_DECODE).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Another CA's prefill certificate, no certificate, plain text: refused at the handshake.
  SecurityConfig rogue = other_->Config("prefill");
  rogue.tls.ca_pem = certs_->Config("prefill").tls.ca_pem;
  EXPECT_EQ(Register(*internal_, rogue, v1::WORKER_ROLE_PREFILL).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Register(*internal_, PublicClient(), v1::WORKER_ROLE_PREFILL).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Register(*internal_, SecurityConfig(), v1::WORKER_ROLE_PREFILL).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A worker's own certificate registers and heartbeats only as that worker (a heartbeat of its
  // own id is answered: known = false, it never registered).
  const SecurityConfig decode7 = certs_->Config("decode-7");
  EXPECT_EQ(Register(*internal_, decode7, v1::WORKER_ROLE_DECODE).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // (Not registered for real: a worker at 127.0.0.1:1 would be routed to by the other tests.)
  auto registry = v1::WorkerRegistry::NewStub(security::CreateChannel(*internal_, decode7));
  for (const char* id : {"decode-7", "intruder"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::HeartbeatRequest beat;
    beat.set_worker_id(id);
    v1::HeartbeatResponse resp;
    EXPECT_EQ(
        registry->Heartbeat(&ctx, beat, &resp).error_code(),
        id == std::string("intruder") ? grpc::StatusCode::PERMISSION_DENIED : grpc::StatusCode::OK)
        << id;
  }
  ASSERT_TRUE(ListWorkers(*internal_, certs_->Config("admin"), "", &list).ok());
  for (const auto& w : list.workers()) EXPECT_NE(w.info().worker_id(), "intruder");
}

TEST_F(RouterSecurityTest, ServesAndScopesRequestIdsToTheKey) {
  std::unique_ptr<FakeWorker> p =
      StartWorker("prefill-0", v1::WORKER_ROLE_PREFILL, absl::ZeroDuration());
  std::unique_ptr<FakeWorker> d =
      StartWorker("decode-0", v1::WORKER_ROLE_DECODE, absl::Milliseconds(20));
  // Alice's long request, id "job".
  auto alice = RouterStub(*public_, PublicClient(), kAlice);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::GenerateRequest req;
  req.set_request_id("job");
  req.add_prompt_token_ids(5);
  req.mutable_sampling()->set_max_tokens(2000);
  req.mutable_sampling()->set_ignore_eos(true);
  auto reader = alice->Generate(&ctx, req);
  v1::GenerateResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));  // the first token: the request is in flight
  EXPECT_EQ(chunk.request_id(), "job");
  // Bob knows the id but cannot abort it; he may use the same id himself.
  auto abort = [&](const char* key) {
    grpc::ClientContext actx;
    v1::AbortRequest areq;
    areq.set_request_id("job");
    v1::AbortResponse aresp;
    EXPECT_TRUE(RouterStub(*public_, PublicClient(), key)->Abort(&actx, areq, &aresp).ok());
    return aresp.found();
  };
  EXPECT_FALSE(abort(kBob));
  {
    grpc::ClientContext bctx;
    v1::GenerateRequest breq = req;
    breq.mutable_sampling()->set_max_tokens(3);
    auto bob = RouterStub(*public_, PublicClient(), kBob)->Generate(&bctx, breq);
    int tokens = 0;
    while (bob->Read(&chunk)) {
      EXPECT_EQ(chunk.request_id(), "job");
      tokens += chunk.token_ids_size();
    }
    EXPECT_TRUE(bob->Finish().ok());
    EXPECT_EQ(tokens, 3);
  }
  ASSERT_TRUE(reader->Read(&chunk));  // Alice's stream goes on
  EXPECT_NE(chunk.finish_reason(), v1::FINISH_REASON_ABORTED);
  EXPECT_TRUE(abort(kAlice));
  v1::FinishReason last = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&chunk)) last = chunk.finish_reason();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last, v1::FINISH_REASON_ABORTED);
  // The fake worker's WorkerService admits only the router's certificate.
  auto worker =
      v1::WorkerService::NewStub(security::CreateChannel(d->address(), certs_->Config("decode")));
  grpc::ClientContext wctx;
  v1::AbortResponse wresp;
  EXPECT_EQ(worker->Abort(&wctx, v1::AbortRequest(), &wresp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Issue 30 item 3: make_certs.sh's role-only decode.pem registered as decode-0 with epoch
// 2^64-1; prompts went to the imposter, and the real decode-0 stayed locked out.
TEST_F(RouterSecurityTest, RoleOnlyCertificateCannotTakeOverAWorker) {
  std::unique_ptr<FakeWorker> p =
      StartWorker("prefill-0", v1::WORKER_ROLE_PREFILL, absl::ZeroDuration());
  std::unique_ptr<FakeWorker> d =
      StartWorker("decode-0", v1::WORKER_ROLE_DECODE, absl::ZeroDuration());
  WaitForHealthy({"prefill-0", "decode-0"});
  const v1::WorkerEntry real = Workers(false)["decode-0"];
  ASSERT_EQ(real.info().address(), d->address());
  const uint64_t kMaxEpoch = ~uint64_t{0};
  grpc::Status s =
      Register(*internal_, certs_->Config("decode"), v1::WORKER_ROLE_DECODE, "decode-0", kMaxEpoch);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(s.error_message(), "permission denied");
  // Not another worker's own certificate either; decode-0's own may not jump to 2^64-1.
  EXPECT_EQ(Register(*internal_, certs_->Config("decode-7"), v1::WORKER_ROLE_DECODE, "decode-0",
                     kMaxEpoch)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Register(*internal_, certs_->Config("decode-0"), v1::WORKER_ROLE_DECODE, "decode-0",
                     kMaxEpoch)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // An imposter daemon with decode.pem, a different model (vocabulary 997) and epoch 2^64-1,
  // retrying its registration and heartbeats all along.
  FakeWorkerOptions o;
  o.worker_id = "decode-0";
  o.role = v1::WORKER_ROLE_DECODE;
  o.epoch = kMaxEpoch;
  o.vocab_size = 997;
  o.router_address = *internal_;
  o.security = certs_->Config("decode");
  absl::StatusOr<std::unique_ptr<FakeWorker>> imposter = FakeWorker::Start(o);
  ASSERT_TRUE(imposter.ok()) << imposter.status();
  EXPECT_FALSE((*imposter)->WaitForHeartbeats(1, absl::Milliseconds(500)));
  std::mt19937 rng(1128);
  for (int i = 0; i < 8; ++i) GenerateAndCheck(rng);
  std::map<std::string, v1::WorkerEntry> workers = Workers(false);
  ASSERT_EQ(workers.count("decode-0"), 1u);
  EXPECT_EQ(workers["decode-0"].info().address(), d->address());
  EXPECT_EQ(workers["decode-0"].info().epoch(), real.info().epoch());
  EXPECT_EQ(workers["decode-0"].info().vocab_size(), 1000u);
  imposter->reset();
  for (int i = 0; i < 4; ++i) GenerateAndCheck(rng);  // the real decode-0 serves on
}

// Issue 30 item 4: decode.pem heartbeating DRAINING for prefill-0 failed 54 of 56 requests.
TEST_F(RouterSecurityTest, OnlyAWorkersOwnCertificateHeartbeatsForIt) {
  std::unique_ptr<FakeWorker> p =
      StartWorker("prefill-0", v1::WORKER_ROLE_PREFILL, absl::ZeroDuration());
  std::unique_ptr<FakeWorker> d =
      StartWorker("decode-0", v1::WORKER_ROLE_DECODE, absl::ZeroDuration());
  WaitForHealthy({"prefill-0", "decode-0"});
  // The forger knows prefill-0's epoch (ListWorkers) and drains it every 2 ms meanwhile.
  const uint64_t epoch = Workers(false)["prefill-0"].info().epoch();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, denied{0};
  std::thread forger([&] {
    const char* certs[] = {"decode", "prefill", "decode-0", "mixed"};
    std::vector<std::unique_ptr<v1::WorkerRegistry::Stub>> stubs;
    for (const char* c : certs) {
      stubs.push_back(
          v1::WorkerRegistry::NewStub(security::CreateChannel(*internal_, certs_->Config(c))));
    }
    while (!stop.load()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::HeartbeatRequest beat;
      beat.set_worker_id("prefill-0");
      beat.set_epoch(epoch);
      beat.set_status(v1::SERVING_STATUS_DRAINING);
      v1::HeartbeatResponse resp;
      grpc::Status s = stubs[sent.load() % stubs.size()]->Heartbeat(&ctx, beat, &resp);
      ++sent;
      if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) ++denied;
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  std::mt19937 rng(30);
  for (int i = 0; i < 20; ++i) GenerateAndCheck(rng);
  stop.store(true);
  forger.join();
  EXPECT_GT(sent.load(), 0);
  EXPECT_EQ(denied.load(), sent.load());
  EXPECT_EQ(Workers(true).count("prefill-0"), 1u);
}

}  // namespace
}  // namespace tandem::router
