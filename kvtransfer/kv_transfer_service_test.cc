// KvTransferServiceImpl + PeerLinks over a real gRPC server on loopback, KV moving through
// InProcessAgents: a load that takes longer than the source's lease (fault-injected delay)
// survives because D renews the lease with RenewLease RPCs (PeerLinks::lease_client()); the
// lease is released afterwards; a restarted source (other epoch) fails the renewal.
#include "kvtransfer/kv_transfer_service.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/pull_connector.h"
#include "kvtransfer/testing/fault_injecting_agent.h"

namespace tandem::kvtransfer {
namespace {

constexpr int kBlocks = 16;
constexpr int kBlockBytes = 8192;

tandem::v1::TransferHandshake LocalHandshake(const std::string& id, uint64_t epoch) {
  tandem::v1::TransferHandshake local;
  local.set_worker_id(id);
  local.set_epoch(epoch);
  local.mutable_compatibility()->set_model_id("renewal-test");
  local.mutable_compatibility()->mutable_layout()->set_block_size(16);
  local.set_compatibility_hash(CompatibilityHash(local.compatibility()));
  return local;
}

// P: agent + connector + KvTransferService on a gRPC server. D: agent behind a fault injector
// (delayed transfers) + connector + PeerLinks.
class LeaseRenewalOverGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    std::mt19937 rng(seed_);
    for (auto& b : src_) b = static_cast<uint8_t>(rng());
    p_agent_ = std::make_unique<InProcessAgent>(fabric_, "p");
    d_agent_ = std::make_unique<InProcessAgent>(fabric_, "d");
    ASSERT_TRUE(
        p_agent_->RegisterMemory(src_.data(), src_.size(), tandem::v1::MEMORY_KIND_HOST).ok());
    ASSERT_TRUE(
        d_agent_->RegisterMemory(dst_.data(), dst_.size(), tandem::v1::MEMORY_KIND_HOST).ok());
    slow_d_ = std::make_unique<FaultInjectingAgent>(d_agent_.get());
    PullKvConnectorOptions options;
    options.block_size = 16;
    options.block_bytes = kBlockBytes;
    options.lease_safety_margin = absl::Milliseconds(100);
    pc_ = std::make_unique<PullKvConnector>(p_agent_.get(), options);
    dc_ = std::make_unique<PullKvConnector>(slow_d_.get(), options);
    service_ = std::make_unique<KvTransferServiceImpl>(p_agent_.get(), pc_.get(),
                                                       LocalHandshake("p", kEpoch));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    endpoint_ = "127.0.0.1:" + std::to_string(port);
    peers_ = std::make_unique<PeerLinks>(slow_d_.get(), LocalHandshake("d", 5),
                                         security::SecurityConfig());
  }
  void TearDown() override {
    peers_.reset();  // sends queued releases first
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  // P leases source blocks {2, 3, 7} for `lease`, bound to D ("d"); returns the handle D gets.
  tandem::v1::KvHandle Lease(absl::Duration lease) {
    std::optional<KvLease> granted = pc_->RequestFinished(42, "req-42", true, 3, lease);
    EXPECT_TRUE(granted.has_value());
    EXPECT_TRUE(pc_->BindLease(granted->lease_id, {"d", "req-42", {2, 3, 7}, 48}).ok());
    tandem::v1::KvHandle handle;
    handle.set_worker_id("p");
    handle.set_epoch(kEpoch);
    for (uint32_t b : {2u, 3u, 7u}) handle.add_block_ids(b);
    handle.set_num_tokens(48);
    handle.set_lease_id(granted->lease_id);
    handle.set_lease_deadline_unix_ms(absl::ToUnixMillis(granted->deadline));
    handle.set_transfer_endpoint(endpoint_);
    handle.set_request_id("req-42");
    return handle;
  }

  // D's side of a Decode (as runtime/worker/worker_service.cc builds it), driven to its end.
  absl::Status LoadFrom(const tandem::v1::KvHandle& handle, uint64_t epoch,
                        std::vector<int64_t>* source_done) {
    RemoteKvSpec remote;
    remote.peer = handle.worker_id();
    remote.epoch = epoch;
    remote.block_ids.assign(handle.block_ids().begin(), handle.block_ids().end());
    remote.num_tokens = static_cast<int64_t>(handle.num_tokens());
    remote.lease_id = handle.lease_id();
    remote.deadline = absl::Now() + absl::Seconds(30);
    remote.lease_deadline = absl::FromUnixMillis(handle.lease_deadline_unix_ms());
    remote.lease_client = peers_->lease_client();
    dc_->UpdateStateAfterAlloc(9, remote, std::vector<int32_t>{10, 11, 12}, 0);
    EXPECT_TRUE(dc_->StartLoad(dc_->BuildStepMeta()).ok());
    for (int i = 0; i < 60000; ++i) {
      const absl::Time now = absl::Now();
      FinishedTransfers p = pc_->GetFinished(now);
      source_done->insert(source_done->end(), p.sending_done.begin(), p.sending_done.end());
      if (!dc_->GetFinished(now).receiving_done.empty()) return absl::OkStatus();
      std::vector<LoadError> errors = dc_->GetLoadErrors();
      if (!errors.empty()) return errors[0].status;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::DeadlineExceededError("test: the load never ended");
  }

  static constexpr uint64_t kEpoch = 1234;
  unsigned seed_ = 0;
  std::shared_ptr<InProcessFabric> fabric_ = std::make_shared<InProcessFabric>();
  std::vector<uint8_t> src_ = std::vector<uint8_t>(kBlocks * kBlockBytes);
  std::vector<uint8_t> dst_ = std::vector<uint8_t>(kBlocks * kBlockBytes, 0);
  std::unique_ptr<InProcessAgent> p_agent_, d_agent_;
  std::unique_ptr<FaultInjectingAgent> slow_d_;
  std::unique_ptr<PullKvConnector> pc_, dc_;
  std::unique_ptr<KvTransferServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string endpoint_;
  std::unique_ptr<PeerLinks> peers_;
};

TEST_F(LeaseRenewalOverGrpcTest, LoadLongerThanTheLeaseSucceedsByRenewing) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const tandem::v1::KvHandle handle = Lease(absl::Seconds(1));
  ASSERT_TRUE(peers_->EnsurePeer(handle).ok());
  ASSERT_TRUE(peers_->AuthorizeRead(handle).ok());
  slow_d_->SetFaults({.delay = absl::Milliseconds(2500)});  // 2.5 leases
  std::vector<int64_t> source_done;
  const absl::Status end = LoadFrom(handle, kEpoch, &source_done);
  ASSERT_TRUE(end.ok()) << end;
  EXPECT_TRUE(source_done.empty()) << "P freed the blocks while D read them";
  EXPECT_GE(dc_->Stats().lease_renewals, 2u);
  EXPECT_EQ(pc_->Stats().leases_expired, 0u);
  const std::vector<int> from = {2, 3, 7};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(std::equal(src_.begin() + from[i] * kBlockBytes,
                           src_.begin() + (from[i] + 1) * kBlockBytes,
                           dst_.begin() + (10 + i) * kBlockBytes))
        << "block " << i;
  }
  // D is done: the release RPC frees the blocks on P.
  peers_->ReleaseLease(handle);
  for (int i = 0; i < 5000 && source_done.empty(); ++i) {
    FinishedTransfers p = pc_->GetFinished(absl::Now());
    source_done.insert(source_done.end(), p.sending_done.begin(), p.sending_done.end());
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(source_done, (std::vector<int64_t>{42}));
  EXPECT_EQ(pc_->Stats().leases_released, 1u);
}

TEST_F(LeaseRenewalOverGrpcTest, RenewalOfAnotherIncarnationFailsTheLoad) {
  const tandem::v1::KvHandle handle = Lease(absl::Seconds(1));
  ASSERT_TRUE(peers_->EnsurePeer(handle).ok());
  slow_d_->SetFaults({.delay = absl::Milliseconds(2500)});
  std::vector<int64_t> source_done;
  // The load claims a lease of an older epoch of P: the renewal says the lease is gone.
  const absl::Status end = LoadFrom(handle, kEpoch - 1, &source_done);
  EXPECT_EQ(end.code(), absl::StatusCode::kFailedPrecondition) << end;
  EXPECT_EQ(dc_->Stats().lease_renewals, 0u);
}

TEST_F(LeaseRenewalOverGrpcTest, RenewerOutlivingPeerLinksAnswersCancelled) {
  std::shared_ptr<LeaseClient> renewer = peers_->lease_client();
  peers_.reset();
  absl::Status answer;
  renewer->RenewLeaseAsync("p", kEpoch, 1, absl::Seconds(1),
                           [&](absl::StatusOr<absl::Time> r) { answer = r.status(); });
  EXPECT_EQ(answer.code(), absl::StatusCode::kCancelled) << answer;
}

// The source, not the reader, bounds how long its blocks stay held: a renewal asking for an hour
// extends the lease by the worker's max_lease at most.
TEST_F(LeaseRenewalOverGrpcTest, RenewalIsCappedByTheSourcesMaxLease) {
  KvTransferServiceImpl capped(p_agent_.get(), pc_.get(), LocalHandshake("p", kEpoch),
                               /*max_lease=*/absl::Seconds(2));
  const tandem::v1::KvHandle handle = Lease(absl::Milliseconds(500));
  tandem::v1::RenewLeaseRequest request;
  request.set_worker_id("p");
  request.set_epoch(kEpoch);
  request.set_lease_id(handle.lease_id());
  request.set_extend_ms(3600 * 1000);
  request.set_reader_worker_id("d");  // plain text: the claim is what the lease is checked with
  tandem::v1::RenewLeaseResponse response;
  grpc::ServerContext context;
  ASSERT_TRUE(capped.RenewLease(&context, &request, &response).ok());
  ASSERT_TRUE(response.renewed());
  EXPECT_LE(absl::FromUnixMillis(response.lease_deadline_unix_ms()),
            absl::Now() + absl::Seconds(2) + absl::Milliseconds(50));
  EXPECT_GE(absl::FromUnixMillis(response.lease_deadline_unix_ms()),
            absl::Now() + absl::Seconds(1));
}

}  // namespace
}  // namespace tandem::kvtransfer
