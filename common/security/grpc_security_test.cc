// Real TLS gRPC servers over loopback: the internal plane's mTLS and role policy, the public
// plane's TLS and API keys.
#include "common/security/grpc_security.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/security/test_certs.h"
#include "tandem/v1/kv.grpc.pb.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::security {
namespace {

// Counts the calls that reach a handler.
class CountingWorker final : public v1::WorkerService::Service {
 public:
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*) override {
    ++calls;
    return grpc::Status::OK;
  }
  grpc::Status Stats(grpc::ServerContext*, const v1::WorkerStatsRequest*,
                     v1::WorkerStats*) override {
    ++calls;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

class CountingKv final : public v1::KvTransferService::Service {
 public:
  grpc::Status ReleaseLease(grpc::ServerContext*, const v1::ReleaseLeaseRequest*,
                            v1::ReleaseLeaseResponse*) override {
    ++calls;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

// Public-plane handler: answers with the caller's API key name in the detail.
class KeyedRouter final : public v1::Router::Service {
 public:
  explicit KeyedRouter(const ApiKeySet* keys) : keys_(keys) {}
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*,
                      v1::HealthResponse* response) override {
    absl::StatusOr<ApiKeyIdentity> id = ApiKeyOf(*ctx, *keys_);
    if (!id.ok())
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(id.status().message()));
    response->set_detail(id->name);
    return grpc::Status::OK;
  }

 private:
  const ApiKeySet* keys_;
};

class GrpcSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> a = MakeTestCerts("cluster");
    absl::StatusOr<TestCerts> b = MakeTestCerts("other", {"--cert=rogue-router:router"});
    ASSERT_TRUE(a.ok() && b.ok());
    certs_ = new TestCerts(*a);
    other_ = new TestCerts(*b);
  }

  // A worker's internal server (prefill certificate).
  void StartWorker() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", InternalServerCredentials(certs_->Config("prefill")),
                             &port_);
    builder.RegisterService(&worker_);
    builder.RegisterService(&kv_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  grpc::Status CallAbort(const SecurityConfig& client) {
    auto stub = v1::WorkerService::NewStub(CreateChannel(Address(), client));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::AbortRequest req;
    v1::AbortResponse resp;
    return stub->Abort(&ctx, req, &resp);
  }
  grpc::Status CallStats(const SecurityConfig& client) {
    auto stub = v1::WorkerService::NewStub(CreateChannel(Address(), client));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::WorkerStatsRequest req;
    v1::WorkerStats resp;
    return stub->Stats(&ctx, req, &resp);
  }
  grpc::Status CallRelease(const SecurityConfig& client) {
    auto stub = v1::KvTransferService::NewStub(CreateChannel(Address(), client));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ReleaseLeaseRequest req;
    v1::ReleaseLeaseResponse resp;
    return stub->ReleaseLease(&ctx, req, &resp);
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }

  static TestCerts* certs_;
  static TestCerts* other_;
  CountingWorker worker_;
  CountingKv kv_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};
TestCerts* GrpcSecurityTest::certs_ = nullptr;
TestCerts* GrpcSecurityTest::other_ = nullptr;

TEST_F(GrpcSecurityTest, RolesDecideWhoCallsWhat) {
  StartWorker();
  EXPECT_TRUE(CallAbort(certs_->Config("router")).ok());
  EXPECT_TRUE(CallStats(certs_->Config("admin")).ok());
  EXPECT_TRUE(CallRelease(certs_->Config("decode")).ok());
  EXPECT_EQ(worker_.calls.load(), 2);
  EXPECT_EQ(kv_.calls.load(), 1);
  // Valid certificates, wrong roles: refused before any handler runs, saying nothing more.
  for (const char* who : {"admin", "decode", "mixed", "prefill", "client"}) {
    grpc::Status s = CallAbort(certs_->Config(who));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_EQ(s.error_message(), "permission denied") << who;
  }
  for (const char* who : {"router", "admin", "client"}) {
    EXPECT_EQ(CallRelease(certs_->Config(who)).error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << who;
  }
  EXPECT_EQ(worker_.calls.load(), 2);
  EXPECT_EQ(kv_.calls.load(), 1);
}

TEST_F(GrpcSecurityTest, CertificateFromAnotherCaIsRefused) {
  StartWorker();
  // A "router" certificate from another CA (trusting our CA so that it accepts the server).
  SecurityConfig rogue = other_->Config("rogue-router");
  rogue.tls.ca_pem = certs_->Config("router").tls.ca_pem;
  grpc::Status s = CallAbort(rogue);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // No client certificate at all, and plain text: refused at the handshake too.
  SecurityConfig anonymous = certs_->Config("router");
  anonymous.tls.cert_pem.clear();
  anonymous.tls.key_pem.clear();
  EXPECT_EQ(CallAbort(anonymous).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallAbort(SecurityConfig()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // And a client that trusts only the other CA refuses our server.
  EXPECT_EQ(CallAbort(other_->Config("router")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(worker_.calls.load(), 0);
}

TEST_F(GrpcSecurityTest, PublicTlsWithApiKeys) {
  absl::StatusOr<ApiKeySet> keys = ApiKeySet::Parse("sk-public-0123456789 alice\n");
  ASSERT_TRUE(keys.ok());
  KeyedRouter router(&*keys);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", PublicServerCredentials(certs_->Config("router"), ""),
                           &port);
  builder.RegisterService(&router);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  SecurityConfig client;  // TLS trusting the CA, no client certificate
  client.insecure = false;
  client.tls.ca_pem = certs_->Config("router").tls.ca_pem;
  auto call = [&](const std::string& key, v1::HealthResponse* resp) {
    auto stub = v1::Router::NewStub(CreateChannel(absl::StrCat("localhost:", port), client));
    grpc::ClientContext ctx;
    AttachApiKey(&ctx, key);
    return stub->Health(&ctx, v1::HealthRequest(), resp);
  };
  v1::HealthResponse resp;
  grpc::Status ok = call("sk-public-0123456789", &resp);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(resp.detail(), "alice");
  EXPECT_EQ(call("", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status wrong = call("sk-public-0123456780", &resp);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message(), "authentication failed");
  // Plain text to a TLS port fails.
  auto plain =
      v1::Router::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port), SecurityConfig()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(plain->Health(&ctx, v1::HealthRequest(), &resp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// No process-wide default: a decode worker's config, passed to the channel, reaches the internal
// plane (the worker's KvTransferService), as PeerLinks and RouterRegistration dial it.
TEST_F(GrpcSecurityTest, ADecodeWorkersConfigDialsTheInternalPlane) {
  const SecurityConfig decode = certs_->Config("decode");
  EXPECT_FALSE(decode.insecure);
  EXPECT_EQ(decode.self->role, Role::kDecode);
  StartWorker();
  auto stub = v1::KvTransferService::NewStub(CreateChannel(Address(), decode));
  grpc::ClientContext ctx;
  v1::ReleaseLeaseResponse resp;
  EXPECT_TRUE(stub->ReleaseLease(&ctx, v1::ReleaseLeaseRequest(), &resp).ok());
}

}  // namespace
}  // namespace tandem::security
