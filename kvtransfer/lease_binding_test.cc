// Lease binding over a real mTLS gRPC plane (certificates from deploy/certs/make_certs.sh, one
// per daemon): a lease bound to decode worker d-0 is usable by d-0 only. Another decode worker
// with a valid decode certificate (d-1), a role-only decode certificate, and d-1 claiming to be
// d-0 are refused on handshake / renew / release / read; d-0 itself is refused for a handle whose
// blocks, tokens, request id or lease were edited; the lease survives every refusal and d-0's
// normal path still works. Also: ReassignLease moves the lease, a plain-text plane checks the
// claimed id only, and a reader refuses an endpoint whose certificate is another worker's.
#include <memory>
#include <string>
#include <vector>

#include "common/security/grpc_security.h"
#include "common/security/test_certs.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/kv_handle.h"
#include "kvtransfer/kv_transfer_service.h"
#include "kvtransfer/pull_connector.h"
#include "tandem/v1/kv.grpc.pb.h"

namespace tandem::kvtransfer {
namespace {

using security::SecurityConfig;
using tandem::v1::KvHandle;
using tandem::v1::KvTransferService;

constexpr uint64_t kEpoch = 77;
constexpr int kBlockBytes = 4096;

tandem::v1::TransferHandshake LocalHandshake(const std::string& id) {
  tandem::v1::TransferHandshake local;
  local.set_worker_id(id);
  local.set_epoch(kEpoch);
  local.mutable_compatibility()->set_model_id("binding-test");
  local.mutable_compatibility()->mutable_layout()->set_block_size(16);
  local.set_compatibility_hash(CompatibilityHash(local.compatibility()));
  return local;
}

const security::TestCerts& Certs() {
  static const security::TestCerts* certs = [] {
    absl::StatusOr<security::TestCerts> made =
        security::MakeTestCerts("binding", {"--worker=p-0:prefill", "--worker=p-9:prefill",
                                            "--worker=d-0:decode", "--worker=d-1:decode"});
    EXPECT_TRUE(made.ok()) << made.status();
    return new security::TestCerts(*made);
  }();
  return *certs;
}

// A KV source (agent + connector + KvTransferService) on a gRPC server with `config`'s plane.
struct Source {
  Source(const std::shared_ptr<InProcessFabric>& fabric, const SecurityConfig& config,
         const std::string& id = "p-0")
      : agent(fabric, id), connector(&agent, Options()) {
    EXPECT_TRUE(agent.RegisterMemory(pool.data(), pool.size(), tandem::v1::MEMORY_KIND_HOST).ok());
    service = std::make_unique<KvTransferServiceImpl>(&agent, &connector, LocalHandshake(id));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", security::InternalServerCredentials(config), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    EXPECT_NE(server, nullptr);
    endpoint = "127.0.0.1:" + std::to_string(port);
  }
  ~Source() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  static PullKvConnectorOptions Options() {
    PullKvConnectorOptions o;
    o.block_size = 16;
    o.block_bytes = kBlockBytes;
    return o;
  }
  // Leases `blocks` for `request`, bound to `reader`; the handle the router would relay.
  KvHandle Lease(const std::string& request, std::vector<int32_t> blocks, const std::string& reader,
                 int64_t request_index) {
    std::optional<KvLease> lease =
        connector.RequestFinished(request_index, request, true, blocks.size(), absl::Seconds(30));
    EXPECT_TRUE(lease.has_value());
    const int64_t tokens = static_cast<int64_t>(blocks.size()) * 16 - 3;
    EXPECT_TRUE(connector.BindLease(lease->lease_id, {reader, request, blocks, tokens}).ok());
    KvSource source{agent.name(), kEpoch, 0, endpoint};
    return ToKvHandle(source, *lease, blocks, tokens, request);
  }
  std::vector<uint8_t> pool = std::vector<uint8_t>(16 * kBlockBytes, 1);
  InProcessAgent agent;
  PullKvConnector connector;
  std::unique_ptr<KvTransferServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

// Raw calls as a given certificate (or plain text), outside PeerLinks.
class Caller {
 public:
  Caller(const std::string& endpoint, const SecurityConfig& config)
      : stub_(KvTransferService::NewStub(security::CreateChannel(endpoint, config))) {}
  // OK when accepted; PERMISSION_DENIED when refused outright, or answered without the source's
  // transport descriptor (accepted = false: only its worker id and epoch).
  grpc::StatusCode Handshake(const std::string& claimed_id) {
    grpc::ClientContext ctx;
    tandem::v1::TransferHandshake hello = LocalHandshake(claimed_id);
    hello.set_transport("inprocess");
    tandem::v1::TransferHandshakeResponse response;
    const grpc::Status s = stub_->Handshake(&ctx, hello, &response);
    if (!s.ok()) return s.error_code();
    const tandem::v1::TransferHandshake& peer = response.peer();
    if (response.accepted()) return grpc::StatusCode::OK;
    EXPECT_TRUE(peer.worker_address().empty() && peer.regions().empty() &&
                peer.transport().empty() && peer.access_token().empty())
        << "a refused handshake must not describe the pool";
    EXPECT_EQ(peer.epoch(), kEpoch);
    return grpc::StatusCode::PERMISSION_DENIED;
  }
  grpc::StatusCode Renew(const KvHandle& h, const std::string& claimed_id = "") {
    grpc::ClientContext ctx;
    tandem::v1::RenewLeaseRequest request;
    request.set_worker_id(h.worker_id());
    request.set_epoch(h.epoch());
    request.set_lease_id(h.lease_id());
    request.set_extend_ms(1000);
    request.set_reader_worker_id(claimed_id);
    tandem::v1::RenewLeaseResponse response;
    return stub_->RenewLease(&ctx, request, &response).error_code();
  }
  grpc::StatusCode Release(const KvHandle& h, const std::string& claimed_id = "") {
    grpc::ClientContext ctx;
    tandem::v1::ReleaseLeaseRequest request;
    request.set_worker_id(h.worker_id());
    request.set_epoch(h.epoch());
    request.set_lease_id(h.lease_id());
    request.set_reader_worker_id(claimed_id);
    tandem::v1::ReleaseLeaseResponse response;
    return stub_->ReleaseLease(&ctx, request, &response).error_code();
  }
  grpc::StatusCode Read(const KvHandle& h, const std::string& claimed_id = "") {
    grpc::ClientContext ctx;
    tandem::v1::AuthorizeReadRequest request;
    *request.mutable_handle() = h;
    request.set_reader_worker_id(claimed_id);
    tandem::v1::AuthorizeReadResponse response;
    return stub_->AuthorizeRead(&ctx, request, &response).error_code();
  }

 private:
  std::unique_ptr<KvTransferService::Stub> stub_;
};

constexpr grpc::StatusCode kDenied = grpc::StatusCode::PERMISSION_DENIED;

class LeaseBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // This process is decode worker d-0: PeerLinks dials with its certificate.
    source_ = std::make_unique<Source>(fabric_, Certs().Config("p-0"));
    reader_agent_ = std::make_unique<InProcessAgent>(fabric_, "d-0");
    links_ = std::make_unique<PeerLinks>(reader_agent_.get(), LocalHandshake("d-0"),
                                         Certs().Config("d-0"));
  }
  void TearDown() override {
    links_.reset();
    source_.reset();
  }
  // Whether the lease is still alive and d-0's.
  bool StillD0s(const KvHandle& h) {
    return source_->connector.AuthorizeLeaseUse({h.lease_id(), "d-0", nullptr}).ok();
  }

  std::shared_ptr<InProcessFabric> fabric_ = std::make_shared<InProcessFabric>();
  std::unique_ptr<Source> source_;
  std::unique_ptr<InProcessAgent> reader_agent_;
  std::unique_ptr<PeerLinks> links_;
};

TEST_F(LeaseBindingTest, TheBoundDecodeWorkerHandshakesReadsRenewsAndReleases) {
  const KvHandle handle = source_->Lease("req-1", {2, 3, 7}, "d-0", 1);
  ASSERT_TRUE(links_->EnsurePeer(handle).ok());
  const absl::Status read = links_->AuthorizeRead(handle);
  EXPECT_TRUE(read.ok()) << read;
  Caller d0(source_->endpoint, Certs().Config("d-0"));
  EXPECT_EQ(d0.Renew(handle), grpc::StatusCode::OK);
  EXPECT_EQ(d0.Renew(handle, "d-0"), grpc::StatusCode::OK);  // a claim that is the certificate's
  EXPECT_EQ(d0.Release(handle), grpc::StatusCode::OK);
  EXPECT_EQ(source_->connector.Stats().leases_released, 1u);
  // Gone now: a read is NOT_FOUND, a renewal says not renewed (OK status).
  EXPECT_EQ(d0.Read(handle), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(d0.Renew(handle), grpc::StatusCode::OK);
}

TEST_F(LeaseBindingTest, AnotherDecodeWorkerIsRefusedEverywhere) {
  const KvHandle handle = source_->Lease("req-1", {2, 3, 7}, "d-0", 1);
  Caller d1(source_->endpoint, Certs().Config("d-1"));
  EXPECT_EQ(d1.Handshake("d-1"), kDenied) << "no lease is bound to d-1";
  EXPECT_EQ(d1.Read(handle), kDenied);
  EXPECT_EQ(d1.Renew(handle), kDenied);
  EXPECT_EQ(d1.Release(handle), kDenied);
  // Claiming to be d-0 does not help: the certificate says d-1.
  EXPECT_EQ(d1.Handshake("d-0"), kDenied);
  EXPECT_EQ(d1.Read(handle, "d-0"), kDenied);
  EXPECT_EQ(d1.Renew(handle, "d-0"), kDenied);
  EXPECT_EQ(d1.Release(handle, "d-0"), kDenied);
  // A decode certificate that names no worker cannot use any bound lease.
  Caller role_only(source_->endpoint, Certs().Config("decode"));
  EXPECT_EQ(role_only.Handshake("d-0"), kDenied);
  EXPECT_EQ(role_only.Read(handle, "d-0"), kDenied);
  EXPECT_EQ(role_only.Release(handle, "d-0"), kDenied);
  EXPECT_TRUE(StillD0s(handle)) << "a refused caller changed the lease";
  EXPECT_EQ(source_->connector.Stats().leases_released, 0u);
}

TEST_F(LeaseBindingTest, EditedHandlesAreRefusedEvenForTheBoundWorker) {
  const KvHandle handle = source_->Lease("req-1", {2, 3, 7}, "d-0", 1);
  const KvHandle other = source_->Lease("req-2", {9, 10}, "d-0", 2);
  const KvHandle not_ours = source_->Lease("req-3", {11}, "d-1", 3);
  Caller d0(source_->endpoint, Certs().Config("d-0"));
  ASSERT_EQ(d0.Read(handle), grpc::StatusCode::OK);
  std::vector<std::pair<std::string, KvHandle>> edits;
  auto edit = [&](const std::string& what, auto change) {
    KvHandle h = handle;
    change(h);
    edits.emplace_back(what, h);
  };
  edit("a block id changed", [](KvHandle& h) { h.set_block_ids(1, 12); });
  edit("a block added", [](KvHandle& h) { h.add_block_ids(8); });
  edit("a block dropped", [](KvHandle& h) { h.mutable_block_ids()->RemoveLast(); });
  edit("blocks reordered", [](KvHandle& h) { h.mutable_block_ids()->SwapElements(0, 1); });
  edit("another request's blocks",
       [&](KvHandle& h) { *h.mutable_block_ids() = other.block_ids(); });
  edit("more tokens", [](KvHandle& h) { h.set_num_tokens(h.num_tokens() + 1); });
  edit("another request id", [](KvHandle& h) { h.set_request_id("req-2"); });
  edit("no request id", [](KvHandle& h) { h.clear_request_id(); });
  edit("the lease of another request", [&](KvHandle& h) { h.set_lease_id(other.lease_id()); });
  edit("a lease bound to d-1", [&](KvHandle& h) { h.set_lease_id(not_ours.lease_id()); });
  for (const auto& [what, h] : edits) {
    EXPECT_EQ(d0.Read(h), kDenied) << what;
  }
  KvHandle unknown = handle;
  unknown.set_lease_id(handle.lease_id() ^ 0x5a5a);
  EXPECT_EQ(d0.Read(unknown), grpc::StatusCode::NOT_FOUND);
  KvHandle stale = handle;
  stale.set_epoch(kEpoch - 1);
  EXPECT_EQ(d0.Read(stale), grpc::StatusCode::FAILED_PRECONDITION);
  // d-0 may not renew or release d-1's lease either.
  EXPECT_EQ(d0.Renew(not_ours), kDenied);
  EXPECT_EQ(d0.Release(not_ours), kDenied);
  EXPECT_TRUE(StillD0s(handle));
  EXPECT_TRUE(StillD0s(other));
  EXPECT_EQ(source_->connector.Stats().leases_released, 0u);
}

TEST_F(LeaseBindingTest, ReassignMovesTheLeaseToTheNewDecodeWorker) {
  const KvHandle handle = source_->Lease("req-1", {2, 3}, "d-0", 1);
  Caller d0(source_->endpoint, Certs().Config("d-0"));
  Caller d1(source_->endpoint, Certs().Config("d-1"));
  EXPECT_EQ(source_->connector.ReassignLease("req-2", handle.lease_id(), "d-1").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(source_->connector.ReassignLease("req-1", handle.lease_id() + 1, "d-1").code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(source_->connector.ReassignLease("req-1", handle.lease_id(), "d-1").ok());
  EXPECT_EQ(d0.Read(handle), kDenied);
  EXPECT_EQ(d0.Release(handle), kDenied);
  EXPECT_EQ(d1.Handshake("d-1"), grpc::StatusCode::OK);
  EXPECT_EQ(d1.Read(handle), grpc::StatusCode::OK);
  EXPECT_EQ(d1.Release(handle), grpc::StatusCode::OK);
}

// The reader checks who answers: an endpoint holding another worker's certificate does not get
// to serve (or see) a handle naming p-0.
TEST_F(LeaseBindingTest, ReaderRefusesAnEndpointWithAnotherWorkersCertificate) {
  Source impostor(std::make_shared<InProcessFabric>(), Certs().Config("p-9"), "p-0");
  const KvHandle handle = impostor.Lease("req-1", {1}, "d-0", 1);
  const absl::Status linked = links_->EnsurePeer(handle);
  EXPECT_EQ(linked.code(), absl::StatusCode::kPermissionDenied) << linked;
}

// --insecure: nothing is authenticated, so the source can only compare the claimed reader id.
// It still refuses a claim of another worker and edited handles (accidents, not attackers).
TEST(LeaseBindingInsecureTest, PlainTextChecksTheClaimedReaderOnly) {
  auto fabric = std::make_shared<InProcessFabric>();
  Source source(fabric, SecurityConfig());
  const KvHandle handle = source.Lease("req-1", {4, 5}, "d-0", 1);
  Caller anyone(source.endpoint, SecurityConfig());
  EXPECT_EQ(anyone.Handshake("d-1"), kDenied);
  EXPECT_EQ(anyone.Read(handle, "d-1"), kDenied);
  EXPECT_EQ(anyone.Renew(handle, ""), kDenied);
  KvHandle edited = handle;
  edited.set_block_ids(0, 6);
  EXPECT_EQ(anyone.Read(edited, "d-0"), kDenied);
  EXPECT_EQ(anyone.Handshake("d-0"), grpc::StatusCode::OK);  // the claim is all there is
  EXPECT_EQ(anyone.Read(handle, "d-0"), grpc::StatusCode::OK);
  EXPECT_EQ(anyone.Release(handle, "d-0"), grpc::StatusCode::OK);
  // A lease bound to no reader (an --insecure worker asked without decode_worker_id): anyone.
  const KvHandle open = source.Lease("req-2", {6}, "", 2);
  EXPECT_EQ(anyone.Read(open, "whoever"), grpc::StatusCode::OK);
}

TEST(LeaseBindingConnectorTest, BindOnceWithTheLeasesBlocks) {
  auto fabric = std::make_shared<InProcessFabric>();
  InProcessAgent agent(fabric, "p");
  PullKvConnector connector(&agent, Source::Options());
  std::optional<KvLease> lease = connector.RequestFinished(1, "r", true, 2, absl::Seconds(5));
  ASSERT_TRUE(lease.has_value());
  // Unbound: serves no one, not even a handshake.
  EXPECT_EQ(connector.AuthorizeLeaseUse({lease->lease_id, "d", nullptr}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(connector.HasLeaseFor("d"));
  EXPECT_EQ(connector.BindLease(lease->lease_id, {"d", "r", {1}, 16}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(connector.BindLease(lease->lease_id + 1, {"d", "r", {1, 2}, 20}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(connector.BindLease(lease->lease_id, {"d", "r", {1, 2}, 20}).ok());
  EXPECT_EQ(connector.BindLease(lease->lease_id, {"e", "r", {1, 2}, 20}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(connector.HasLeaseFor("d"));
  EXPECT_FALSE(connector.HasLeaseFor("e"));
  ASSERT_TRUE(connector.ReleaseLease(lease->lease_id));
  EXPECT_FALSE(connector.HasLeaseFor("d"));
}

}  // namespace
}  // namespace tandem::kvtransfer
