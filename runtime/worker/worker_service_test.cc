// The worker's gRPC surface with real gRPC servers on loopback: a prefill worker and a decode
// worker in one process whose KV moves through InProcessAgents (the UCX agent and separate
// processes are exercised by //tests/e2e). Checks the P->D handoff over the real RPCs
// (Prefill -> KvHandle -> Decode, handshake, lease release), equality with a mixed worker,
// stale handles (source restarted), role checks, bad input and client cancel.
#include "runtime/worker/worker_service.h"

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "runtime/worker/worker_daemon.h"

namespace tandem::runtime {
namespace {

using kvtransfer::InProcessAgent;
using kvtransfer::InProcessFabric;

// A whole worker in-process, built as tandem_worker builds one (WorkerDaemon::Create from a
// WorkerConfig), with an in-process transfer agent on the test's fabric.
class TestWorker {
 public:
  TestWorker(std::shared_ptr<InProcessFabric> fabric, const std::string& id,
             tandem::v1::WorkerRole role) {
    WorkerConfig config;
    config.role = role;
    config.worker_id = id;
    config.model.load_format = "dummy";
    config.model.dummy_config = "tiny";
    config.model.dummy_seed = 5;
    config.backend.num_threads = 1;
    config.engine.num_threads = 1;
    config.engine.kv_cache_bytes = int64_t{4} << 20;
    config.engine.max_model_len = 256;
    config.make_agent = [fabric,
                         id]() -> absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> {
      return std::make_unique<InProcessAgent>(fabric, id);
    };
    absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(config);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) std::abort();
    daemon_ = *std::move(daemon);
    stub_ = tandem::v1::WorkerService::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
    blocks_ = worker().Load().kv_blocks_total();
  }

  tandem::v1::WorkerService::Stub& stub() { return *stub_; }
  Worker& worker() { return daemon_->worker(); }
  int64_t blocks() const { return blocks_; }
  int64_t free_blocks() { return worker().Load().kv_blocks_free(); }
  tandem::v1::WorkerStats stats() { return worker().StatsProto(); }
  // Waits (bounded) until every block is free again; returns the free count.
  int64_t WaitAllFree() {
    for (int i = 0; i < 200 && free_blocks() != blocks_; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return free_blocks();
  }

 private:
  std::unique_ptr<WorkerDaemon> daemon_;
  std::unique_ptr<tandem::v1::WorkerService::Stub> stub_;
  int64_t blocks_ = 0;
};

tandem::v1::GenerateRequest MakeRequest(const std::string& id, std::mt19937& rng, int len,
                                        int max_tokens) {
  tandem::v1::GenerateRequest r;
  r.set_request_id(id);
  for (int i = 0; i < len; ++i) r.add_prompt_token_ids(rng() % 256);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

struct StreamResult {
  std::vector<uint32_t> tokens;
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  grpc::Status status;
};

template <typename Reader>
StreamResult ReadAll(Reader& reader) {
  StreamResult out;
  tandem::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED)
      out.finish = msg.finish_reason();
  }
  out.status = reader->Finish();
  return out;
}

StreamResult RunMixed(TestWorker& w, const tandem::v1::GenerateRequest& request) {
  grpc::ClientContext ctx;
  auto reader = w.stub().Generate(&ctx, request);
  return ReadAll(reader);
}

StreamResult RunDisaggregated(TestWorker& p, TestWorker& d,
                              const tandem::v1::GenerateRequest& request,
                              tandem::v1::PrefillResponse* prefill_out = nullptr) {
  tandem::v1::PrefillRequest pre;
  *pre.mutable_request() = request;
  pre.set_remote_decode(true);
  tandem::v1::PrefillResponse prefilled;
  grpc::ClientContext pctx;
  grpc::Status ps = p.stub().Prefill(&pctx, pre, &prefilled);
  StreamResult out;
  if (!ps.ok()) {
    out.status = ps;
    return out;
  }
  if (prefill_out != nullptr) *prefill_out = prefilled;
  out.tokens.push_back(prefilled.first_token());
  if (prefilled.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
    out.finish = prefilled.finish_reason();
    return out;
  }
  tandem::v1::DecodeRequest dec;
  *dec.mutable_request() = request;
  dec.set_first_token(prefilled.first_token());
  *dec.mutable_kv_handle() = prefilled.kv_handle();
  grpc::ClientContext dctx;
  auto reader = d.stub().Decode(&dctx, dec);
  StreamResult rest = ReadAll(reader);
  out.tokens.insert(out.tokens.end(), rest.tokens.begin(), rest.tokens.end());
  out.finish = rest.finish;
  out.status = rest.status;
  return out;
}

TEST(WorkerServiceTest, PrefillDecodeOverGrpcEqualsMixedWorker) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  TestWorker p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
  TestWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE);
  TestWorker m(fabric, "m0", tandem::v1::WORKER_ROLE_MIXED);
  for (int i = 0; i < 6; ++i) {
    auto request = MakeRequest("r" + std::to_string(i), rng, 1 + rng() % 60, 2 + rng() % 8);
    tandem::v1::PrefillResponse prefilled;
    StreamResult split = RunDisaggregated(p, d, request, &prefilled);
    StreamResult whole = RunMixed(m, request);
    ASSERT_TRUE(split.status.ok()) << split.status.error_message();
    ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
    EXPECT_EQ(split.tokens, whole.tokens) << "request " << i;
    EXPECT_EQ(split.finish, tandem::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(prefilled.kv_handle().worker_id(), "p0");
    EXPECT_EQ(prefilled.kv_handle().num_tokens(),
              static_cast<uint64_t>(request.prompt_token_ids_size()));
  }
  // D released every lease after loading: P's pool is whole again.
  EXPECT_EQ(p.WaitAllFree(), p.blocks());
  EXPECT_EQ(d.WaitAllFree(), d.blocks());
  EXPECT_EQ(p.stats().leases_released(), 6u);
  tandem::v1::WorkerStats stats = d.worker().StatsProto();
  EXPECT_GT(stats.kv_bytes_received(), 0u);
  EXPECT_EQ(stats.kv_load_failures(), 0u);
}

// The lease is bound to the decode worker named in the PrefillRequest: another one is refused
// (PERMISSION_DENIED, nothing recomputed) until ReassignLease (the router's decode retry) moves
// the lease to it, over the RPC.
TEST(WorkerServiceTest, LeaseServesTheNamedDecodeWorkerAndMovesWithReassignLease) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  TestWorker p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
  TestWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE);
  const auto request = MakeRequest("bound", rng, 40, 6);
  tandem::v1::PrefillRequest pre;
  *pre.mutable_request() = request;
  pre.set_remote_decode(true);
  pre.set_decode_worker_id("d9");
  tandem::v1::PrefillResponse prefilled;
  grpc::ClientContext pctx;
  ASSERT_TRUE(p.stub().Prefill(&pctx, pre, &prefilled).ok());
  auto decode = [&] {
    tandem::v1::DecodeRequest dec;
    *dec.mutable_request() = request;
    dec.set_first_token(prefilled.first_token());
    *dec.mutable_kv_handle() = prefilled.kv_handle();
    grpc::ClientContext ctx;
    auto reader = d.stub().Decode(&ctx, dec);
    return ReadAll(reader);
  };
  const StreamResult refused = decode();
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << refused.status.error_message();
  EXPECT_TRUE(refused.tokens.empty());
  auto reassign = [&](const std::string& id) {
    tandem::v1::ReassignLeaseRequest move;
    move.set_request_id(id);
    move.set_lease_id(prefilled.kv_handle().lease_id());
    move.set_decode_worker_id("d0");
    tandem::v1::ReassignLeaseResponse moved;
    grpc::ClientContext ctx;
    return p.stub().ReassignLease(&ctx, move, &moved).error_code();
  };
  EXPECT_EQ(reassign("other"), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(reassign("bound"), grpc::StatusCode::OK);
  const StreamResult served = decode();
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.tokens.size(), 5u);
  EXPECT_EQ(p.WaitAllFree(), p.blocks());
  EXPECT_EQ(d.WaitAllFree(), d.blocks());
}

TEST(WorkerServiceTest, StaleHandleFromRestartedSourceIsRecomputedOrFailed) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  auto request = MakeRequest("stale", rng, 40, 6);
  tandem::v1::PrefillResponse prefilled;
  StreamResult expected;
  TestWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE);
  TestWorker m(fabric, "m0", tandem::v1::WORKER_ROLE_MIXED);
  expected = RunMixed(m, request);
  std::string old_address;
  {
    TestWorker p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
    tandem::v1::PrefillRequest pre;
    *pre.mutable_request() = request;
    pre.set_remote_decode(true);
    grpc::ClientContext ctx;
    ASSERT_TRUE(p.stub().Prefill(&ctx, pre, &prefilled).ok());
  }
  // P restarts under the same name (a new process: a later epoch), on a new port.
  TestWorker p2(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
  tandem::v1::KvHandle handle = prefilled.kv_handle();
  handle.set_transfer_endpoint(p2.worker().address());
  for (auto policy :
       {tandem::v1::KV_LOAD_FAILURE_POLICY_RECOMPUTE, tandem::v1::KV_LOAD_FAILURE_POLICY_FAIL}) {
    tandem::v1::DecodeRequest dec;
    *dec.mutable_request() = request;
    dec.mutable_request()->set_request_id(std::string("stale-") + std::to_string(policy));
    dec.set_first_token(prefilled.first_token());
    *dec.mutable_kv_handle() = handle;
    dec.mutable_kv_handle()->set_request_id(dec.request().request_id());  // a request of its own
    dec.set_on_kv_failure(policy);
    grpc::ClientContext ctx;
    auto reader = d.stub().Decode(&ctx, dec);
    StreamResult rest = ReadAll(reader);
    if (policy == tandem::v1::KV_LOAD_FAILURE_POLICY_FAIL) {
      EXPECT_EQ(rest.status.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_NE(rest.status.error_message().find("restarted"), std::string::npos)
          << rest.status.error_message();
    } else {
      ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
      std::vector<uint32_t> joined = {prefilled.first_token()};
      joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
      EXPECT_EQ(joined, expected.tokens) << "recompute on D gives the same tokens";
    }
  }
  EXPECT_EQ(d.worker().StatsProto().kv_load_failures(), 2u);
  EXPECT_EQ(d.WaitAllFree(), d.blocks());
}

TEST(WorkerServiceTest, RolesAndBadInputAreRefusedBeforeAnythingIsAllocated) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  TestWorker p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
  TestWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE);
  {  // Generate on a prefill worker
    grpc::ClientContext ctx;
    auto reader = p.stub().Generate(&ctx, MakeRequest("x", rng, 5, 3));
    EXPECT_EQ(ReadAll(reader).status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {  // Prefill on a decode worker
    tandem::v1::PrefillRequest pre;
    *pre.mutable_request() = MakeRequest("y", rng, 5, 3);
    tandem::v1::PrefillResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(d.stub().Prefill(&ctx, pre, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  std::vector<std::pair<std::string, tandem::v1::GenerateRequest>> bad;
  auto base = MakeRequest("bad", rng, 5, 3);
  auto r = base;
  r.add_prompt_token_ids(100000);  // outside the vocabulary
  bad.emplace_back("token id", r);
  r = base;
  r.clear_prompt_token_ids();
  bad.emplace_back("empty prompt", r);
  r = base;
  r.mutable_sampling()->set_max_tokens(252);  // 5 + 252 > 256
  bad.emplace_back("too long", r);
  r = base;
  r.mutable_sampling()->set_temperature(-1);
  bad.emplace_back("temperature", r);
  r = base;
  r.set_request_id("");
  bad.emplace_back("no id", r);
  for (const auto& [what, req] : bad) {
    tandem::v1::PrefillRequest pre;
    *pre.mutable_request() = req;
    pre.set_remote_decode(true);
    tandem::v1::PrefillResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(p.stub().Prefill(&ctx, pre, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what;
  }
  EXPECT_EQ(p.free_blocks(), p.blocks());
  EXPECT_EQ(p.stats().leases_granted(), 0u);
  {  // Decode with a handle of another layout
    tandem::v1::DecodeRequest dec;
    *dec.mutable_request() = base;
    dec.mutable_kv_handle()->set_layout_hash(12345);
    dec.mutable_kv_handle()->set_worker_id("p0");
    grpc::ClientContext ctx;
    auto reader = d.stub().Decode(&ctx, dec);
    EXPECT_EQ(ReadAll(reader).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST(WorkerServiceTest, AbortReleasesLeaseAndCancelFreesDecodeBlocks) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  TestWorker p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL);
  TestWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE);
  // Abort on P after prefill: the router's client went away before decode started.
  auto request = MakeRequest("gone", rng, 35, 50);
  tandem::v1::PrefillRequest pre;
  *pre.mutable_request() = request;
  pre.set_remote_decode(true);
  tandem::v1::PrefillResponse prefilled;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(p.stub().Prefill(&ctx, pre, &prefilled).ok());
  }
  EXPECT_LT(p.free_blocks(), p.blocks());
  {
    tandem::v1::AbortRequest abort;
    abort.set_request_id("gone");
    tandem::v1::AbortResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(p.stub().Abort(&ctx, abort, &resp).ok());
    EXPECT_TRUE(resp.found());
  }
  EXPECT_EQ(p.WaitAllFree(), p.blocks());

  // Client cancels a decode stream mid-way: D frees its blocks.
  request = MakeRequest("cancel", rng, 30, 200);
  *pre.mutable_request() = request;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(p.stub().Prefill(&ctx, pre, &prefilled).ok());
  }
  tandem::v1::DecodeRequest dec;
  *dec.mutable_request() = request;
  dec.set_first_token(prefilled.first_token());
  *dec.mutable_kv_handle() = prefilled.kv_handle();
  grpc::ClientContext dctx;
  auto reader = d.stub().Decode(&dctx, dec);
  tandem::v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  dctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(d.WaitAllFree(), d.blocks());
  EXPECT_EQ(p.WaitAllFree(), p.blocks()) << "the lease was released once D loaded";
}

}  // namespace
}  // namespace tandem::runtime
