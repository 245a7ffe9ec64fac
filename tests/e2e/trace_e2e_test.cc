// Per-request traces (issue 21 item 4) through real processes: a 1P1D cluster (tiny dummy model,
// plain text), the router with --log_format=json. One request asks for its trace: the final
// message carries it, complete and consistent (phases present and in order, the P and D ids,
// KV bytes = the decode worker's kv_bytes_received delta); the router's log has one JSON line
// for it that parses back into the same trace; tandem_cli generate --json --trace prints it.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"

namespace tandem::e2e {
namespace {

namespace v1 = tandem::v1;

absl::StatusOr<v1::RequestTrace> ParseTrace(absl::string_view json) {
  v1::RequestTrace trace;
  auto s = google::protobuf::util::JsonStringToMessage(std::string(json), &trace);
  if (!s.ok()) return absl::InvalidArgumentError(std::string(s.message()));
  return trace;
}

// The router log's request_trace line for `request_id`, parsed (strict JSON).
absl::StatusOr<v1::RequestTrace> TraceFromLog(const std::string& log, const std::string& id) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::ConsumePrefix(&line, "{\"request_trace\":")) continue;
    if (!absl::ConsumeSuffix(&line, "}")) return absl::InvalidArgumentError("unclosed line");
    absl::StatusOr<v1::RequestTrace> trace = ParseTrace(line);
    if (!trace.ok()) return trace.status();
    if (trace->request_id() == id) return trace;
  }
  return absl::NotFoundError(absl::StrCat("no request_trace line for ", id));
}

void ExpectComplete(const v1::RequestTrace& t, const std::string& p, const std::string& d) {
  EXPECT_EQ(t.prefill_worker_id(), p);
  EXPECT_EQ(t.decode_worker_id(), d);
  EXPECT_TRUE(t.mixed_worker_id().empty());
  EXPECT_GT(t.start_unix_micros(), 0);
  // Router phases, in order.
  EXPECT_GT(t.prefill_sent_micros(), 0u);
  EXPECT_LE(t.prefill_sent_micros(), t.prefill_done_micros());
  EXPECT_LE(t.prefill_done_micros(), t.first_token_micros());
  EXPECT_LE(t.first_token_micros(), t.decode_sent_micros());
  EXPECT_LE(t.decode_sent_micros(), t.decode_first_micros());
  EXPECT_LE(t.decode_first_micros(), t.end_micros());
  // Worker phases: present, and each inside the router's view of it.
  EXPECT_GT(t.prefill().prefill_micros(), 0u);
  EXPECT_LE(t.prefill().prefill_micros(), t.prefill_done_micros() - t.prefill_sent_micros());
  EXPECT_GT(t.decode().kv_load_micros(), 0u);
  EXPECT_GT(t.decode().kv_bytes(), 0u);
  EXPECT_GT(t.decode().first_token_micros(), 0u);
  EXPECT_LE(t.decode().first_token_micros(), t.decode().decode_micros());
  EXPECT_LE(t.decode().kv_load_micros(), t.decode().first_token_micros());
  EXPECT_LE(t.decode().kv_link_micros() + t.decode().decode_micros(),
            t.end_micros() - t.decode_sent_micros());
  EXPECT_FALSE(t.decode().kv_recomputed());
  EXPECT_EQ(t.decode_attempts(), 1u);
  EXPECT_EQ(t.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(t.status(), "OK");
  EXPECT_EQ(t.prompt_tokens(), 40u);
  EXPECT_EQ(t.completion_tokens(), 6u);
}

TEST(TraceE2E, OneRequestAcrossRouterPrefillDecode) {
  ClusterOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.dummy_config = "tiny";
  options.tls = false;
  options.router_flags = {"--log_format=json"};
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  std::string p_id, d_id;
  for (WorkerHandle& w : c.workers()) (w.role == "prefill" ? p_id : d_id) = w.id;
  absl::StatusOr<v1::WorkerStats> before = c.Stats(d_id);
  ASSERT_TRUE(before.ok()) << before.status();

  v1::GenerateRequest req;
  req.set_request_id("trace-1");
  for (uint32_t i = 0; i < 40; ++i) req.add_prompt_token_ids(3 + i);
  req.mutable_sampling()->set_max_tokens(6);
  req.mutable_sampling()->set_ignore_eos(true);
  req.set_trace(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = c.router().Generate(&ctx, req);
  v1::GenerateResponse chunk, last;
  int with_trace = 0;
  while (reader->Read(&chunk)) {
    if (chunk.has_trace()) ++with_trace;
    if (chunk.has_worker_times()) ADD_FAILURE() << "worker times leaked to the client";
    last = chunk;
  }
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message() << c.Logs();
  EXPECT_EQ(with_trace, 1);
  ASSERT_TRUE(last.has_trace());
  const v1::RequestTrace& t = last.trace();
  EXPECT_EQ(t.request_id(), "trace-1");
  ExpectComplete(t, p_id, d_id);

  absl::StatusOr<v1::WorkerStats> after = c.Stats(d_id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(t.decode().kv_bytes(), after->kv_bytes_received() - before->kv_bytes_received());

  // The JSON log line: written when the stream ended (the router logs right after the last
  // message; give it a moment).
  absl::StatusOr<v1::RequestTrace> logged = absl::NotFoundError("not yet");
  for (int i = 0; i < 100 && !logged.ok(); ++i) {
    logged = TraceFromLog(c.router_process().LogTail(1 << 20), "trace-1");
    if (!logged.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(logged.ok()) << logged.status() << c.Logs();
  ExpectComplete(*logged, p_id, d_id);
  EXPECT_EQ(logged->decode().kv_bytes(), t.decode().kv_bytes());
  EXPECT_EQ(logged->prefill_done_micros(), t.prefill_done_micros());

  // tandem_cli generate --json --trace prints it.
  const std::string cmd = absl::StrCat(Runfile("router/tandem_cli"),
                                       " generate --insecure --router=", c.router_address(),
                                       " --prompt_ids=5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21"
                                       " --max_tokens=4 --ignore_eos --json --trace 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const size_t at = out.find(",\"trace\":");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string tail = out.substr(at + 9);
  absl::string_view rest = absl::StripTrailingAsciiWhitespace(tail);
  ASSERT_TRUE(absl::ConsumeSuffix(&rest, "}")) << out;
  absl::StatusOr<v1::RequestTrace> cli = ParseTrace(rest);
  ASSERT_TRUE(cli.ok()) << cli.status() << "\n" << out;
  EXPECT_EQ(cli->prefill_worker_id(), p_id);
  EXPECT_EQ(cli->decode_worker_id(), d_id);
  EXPECT_EQ(cli->completion_tokens(), 4u);
  EXPECT_GT(cli->decode().kv_bytes(), 0u);
  EXPECT_GT(cli->end_micros(), cli->first_token_micros());
}

}  // namespace
}  // namespace tandem::e2e
