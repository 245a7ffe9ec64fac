// The generated gRPC stubs work end to end over a real loopback socket: unary and server-
// streaming calls, the message-size cap, and deadlines. A fake WorkerService stands in for the
// worker daemon (the real one arrives with the serving issue).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::v1 {
namespace {

class FakeWorker final : public WorkerService::Service {
 public:
  grpc::Status Health(grpc::ServerContext*, const WorkerHealthRequest*,
                      HealthResponse* resp) override {
    resp->set_status(SERVING_STATUS_SERVING);
    resp->set_detail("fake");
    return grpc::Status::OK;
  }

  // Returns a handle whose block ids cover the prompt (block size 16) and echoes the last
  // prompt token as the "first token".
  grpc::Status Prefill(grpc::ServerContext*, const PrefillRequest* req,
                       PrefillResponse* resp) override {
    const auto& prompt = req->request().prompt_token_ids();
    if (prompt.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty prompt");
    }
    resp->set_request_id(req->request().request_id());
    resp->set_first_token(prompt[prompt.size() - 1]);
    KvHandle* h = resp->mutable_kv_handle();
    h->set_worker_id("p0");
    h->set_num_tokens(prompt.size());
    for (int b = 0; b < (prompt.size() + 15) / 16; ++b) h->add_block_ids(1000 + b);
    return grpc::Status::OK;
  }

  // Streams max_tokens - 1 tokens counting up from first_token, one per message.
  grpc::Status Decode(grpc::ServerContext* ctx, const DecodeRequest* req,
                      grpc::ServerWriter<GenerateResponse>* writer) override {
    const uint32_t n = req->request().sampling().max_tokens();
    for (uint32_t i = 1; i < n; ++i) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      GenerateResponse chunk;
      chunk.set_request_id(req->request().request_id());
      chunk.add_token_ids(req->first_token() + i);
      if (i + 1 == n) {
        chunk.set_finish_reason(FINISH_REASON_LENGTH);
        chunk.mutable_usage()->set_completion_tokens(n);
      }
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }
};

class GrpcLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    // Loopback only, kernel-chosen port: internal ports never bind all interfaces.
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxGrpcMessageBytes));
    builder.SetMaxSendMessageSize(static_cast<int>(kMaxGrpcMessageBytes));
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);  // let oversized requests reach the server's cap
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = WorkerService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  FakeWorker service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> stub_;
};

TEST_F(GrpcLoopbackTest, UnaryCalls) {
  grpc::ClientContext ctx;
  HealthResponse health;
  ASSERT_TRUE(stub_->Health(&ctx, WorkerHealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), SERVING_STATUS_SERVING);

  PrefillRequest req;
  req.mutable_request()->set_request_id("req-1");
  for (uint32_t t : {5u, 9u, 2u, 77u}) req.mutable_request()->add_prompt_token_ids(t);
  for (int i = 0; i < 30; ++i) req.mutable_request()->add_prompt_token_ids(i);
  req.set_remote_decode(true);
  grpc::ClientContext ctx2;
  PrefillResponse resp;
  grpc::Status s = stub_->Prefill(&ctx2, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.request_id(), "req-1");
  EXPECT_EQ(resp.first_token(), 29u);
  EXPECT_EQ(resp.kv_handle().num_tokens(), 34u);
  EXPECT_EQ(resp.kv_handle().block_ids_size(), 3);

  grpc::ClientContext ctx3;
  PrefillRequest empty;
  EXPECT_EQ(stub_->Prefill(&ctx3, empty, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcLoopbackTest, ServerStreaming) {
  DecodeRequest req;
  req.mutable_request()->set_request_id("req-2");
  req.mutable_request()->mutable_sampling()->set_max_tokens(50);
  req.set_first_token(100);
  grpc::ClientContext ctx;
  auto reader = stub_->Decode(&ctx, req);
  std::vector<uint32_t> tokens;
  GenerateResponse chunk;
  FinishReason finish = FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&chunk)) {
    for (uint32_t t : chunk.token_ids()) tokens.push_back(t);
    if (chunk.finish_reason() != FINISH_REASON_UNSPECIFIED) finish = chunk.finish_reason();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(tokens.size(), 49u);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(tokens[i], 101 + i);
  EXPECT_EQ(finish, FINISH_REASON_LENGTH);
}

TEST_F(GrpcLoopbackTest, OversizedRequestIsRejectedByTheCap) {
  PrefillRequest req;
  // 5 bytes per token (large ids), ~20 MiB > kMaxGrpcMessageBytes.
  for (int i = 0; i < 4'200'000; ++i) req.mutable_request()->add_prompt_token_ids(0xFFFFFFF0u);
  ASSERT_GT(static_cast<int64_t>(req.ByteSizeLong()), kMaxGrpcMessageBytes);
  grpc::ClientContext ctx;
  PrefillResponse resp;
  EXPECT_EQ(stub_->Prefill(&ctx, req, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The server is still fine afterwards.
  grpc::ClientContext ctx2;
  HealthResponse health;
  EXPECT_TRUE(stub_->Health(&ctx2, WorkerHealthRequest(), &health).ok());
}

TEST_F(GrpcLoopbackTest, DeadReceiverGetsUnavailable) {
  server_->Shutdown();
  server_.reset();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthResponse health;
  grpc::Status s = stub_->Health(&ctx, WorkerHealthRequest(), &health);
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
              s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      << s.error_code() << " " << s.error_message();
}

}  // namespace
}  // namespace tandem::v1
