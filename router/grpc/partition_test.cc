// One-way partitions between the router and one worker, with real packet drops (tc on the
// loopback of a network namespace of the test's own: router/testing/link_drop.h; needs root, as
// CI runs; skipped otherwise). The worker keeps heartbeating (its heartbeats go to the router's
// port, which is not dropped), while one direction of the router's connection to the worker's
// port is black-holed: the calls (and the SYNs of a reconnect), or the replies (and the
// SYN-ACKs). The router must notice and route elsewhere or fail clearly, never hang.
//
// What notices: the worker channels' keepalive (common/grpc_keepalive.h, 1 s + 1 s) fails the
// calls on the black-holed connection in ~2 s; gRPC then sets the reconnect's TCP_USER_TIMEOUT to
// the keepalive timeout, so a SYN into the black hole fails in ~1 s (not at gRPC's 20 s connect
// timeout, which a call queued on a connecting channel would otherwise wait for), and calls fail
// at once while the channel is in TRANSIENT_FAILURE. Measured here: the first request after the
// drop took 1.4-2.0 s (served by the other worker), every later one ~1 ms; with no other decode
// worker, 2.4 s (keepalive + the 0.5 s decode wait) and 1.6 s (a connect timeout + the wait).
// And the public side: a client whose replies are black-holed mid-stream is cut off by the
// port's own keepalive (common/grpc_listener.h), which ends the decode call behind it.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "router/testing/fake_worker.h"
#include "router/testing/link_drop.h"
#include "router/testing/router_test_util.h"

namespace tandem::router {
namespace {

using v1::WORKER_ROLE_DECODE;
using v1::WORKER_ROLE_PREFILL;

// Set by main() before any thread exists: whether the process is in its own network namespace
// with the dropping qdisc on its loopback.
absl::Status& Namespace() {
  static absl::Status* status = new absl::Status(absl::UnknownError("main() did not set it"));
  return *status;
}

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }
int PortOf(const FakeWorker& w) { return PortOf(w.address()); }

// Keepalive (1 s + 1 s) sees the dead connection in ~2 s; the rest is slack for a loaded host.
constexpr absl::Duration kNoticed = absl::Seconds(5);
constexpr absl::Duration kClientDeadline = absl::Seconds(15);

class PartitionTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!Namespace().ok()) {
      GTEST_SKIP() << Namespace();
    }
  }
  void TearDown() override {
    if (Namespace().ok()) {
      EXPECT_TRUE(StopDropping().ok());
    }
  }

  // Sends `n` requests one after the other: each must be served, in less than kNoticed, with the
  // fake model's tokens.
  void ExpectServed(RouterHarness& h, std::mt19937_64& rng, int n) {
    for (int i = 0; i < n; ++i) {
      const v1::GenerateRequest req = MakeRequest(RandomPrompt(rng, 8, 1000), 4);
      const absl::Time t0 = absl::Now();
      const StreamResult r = h.Generate(req, kClientDeadline);
      const absl::Duration took = absl::Now() - t0;
      std::printf("request %d: %s in %s\n", i, r.status.ok() ? "OK" : "FAILED",
                  absl::FormatDuration(took).c_str());
      ASSERT_TRUE(r.status.ok()) << "request " << i << " after " << took << ": "
                                 << r.status.error_message();
      EXPECT_EQ(r.tokens, FakeGenerate(req, 1000, {}).tokens) << "request " << i;
      EXPECT_LT(took, kNoticed) << "request " << i;
    }
  }
};

// Calls to the preferred decode worker black-holed (its heartbeats arrive): every request is
// decoded by the other one, none waits for the black hole longer than keepalive takes to see it.
TEST_F(PartitionTest, ADecodeWorkerWhoseCallsAreBlackHoledIsRoutedAround) {
  RouterHarness h;
  h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d0 = h.AddWorker("d0", WORKER_ROLE_DECODE);
  FakeWorker* d1 = h.AddWorker("d1", WORKER_ROLE_DECODE);
  d0->SetLoad(Load(0, 0, 4000));  // d0 preferred: most free blocks
  d1->SetLoad(Load(0, 0, 1000));
  h.SyncHeartbeats();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  ExpectServed(h, rng, 1);
  ASSERT_EQ(d0->counters().decode, 1);  // the router's channel to d0 is up
  ASSERT_TRUE(DropPackets(PortOf(*d0), DropDirection::kToPort).ok());
  ExpectServed(h, rng, 6);
  EXPECT_EQ(d0->counters().decode, 1);
  EXPECT_EQ(d1->counters().decode, 6);
}

// The reverse direction for a prefill worker: its replies (and SYN-ACKs) black-holed, the calls
// still reach it. Its prefills never come back; the router retries them on the other one.
TEST_F(PartitionTest, APrefillWorkerWhoseRepliesAreBlackHoledIsRoutedAround) {
  RouterHarness h;
  FakeWorker* p0 = h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* p1 = h.AddWorker("p1", WORKER_ROLE_PREFILL);
  FakeWorker* d0 = h.AddWorker("d0", WORKER_ROLE_DECODE);
  p1->SetLoad(Load(3, 0, 4096));  // p0 preferred: least loaded
  h.SyncHeartbeats();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  ExpectServed(h, rng, 1);
  ASSERT_EQ(p0->counters().prefill, 1);
  ASSERT_TRUE(DropPackets(PortOf(*p0), DropDirection::kFromPort).ok());
  ExpectServed(h, rng, 6);
  EXPECT_EQ(p1->counters().prefill, 6);
  EXPECT_EQ(d0->counters().decode, 7);
}

// With no other decode worker, the request whose decode call was black-holed fails UNAVAILABLE
// after keepalive and the decode wait, and the next one is refused within the routing wait:
// clear failures, not a call left on a connecting channel until the client's deadline.
TEST_F(PartitionTest, WithNoOtherDecodeWorkerRequestsFailClearly) {
  RouterOptions options = TestRouterOptions();
  options.orchestrator.route_wait = absl::Milliseconds(500);
  options.orchestrator.decode_wait = absl::Milliseconds(500);
  RouterHarness h(options);
  h.AddWorker("p0", WORKER_ROLE_PREFILL);
  FakeWorker* d0 = h.AddWorker("d0", WORKER_ROLE_DECODE);
  ASSERT_TRUE(h.Generate(MakeRequest({1, 2, 3}, 4)).status.ok());
  ASSERT_TRUE(DropPackets(PortOf(*d0), DropDirection::kToPort).ok());
  for (int i = 0; i < 2; ++i) {
    const absl::Time t0 = absl::Now();
    const StreamResult r =
        h.Generate(MakeRequest({4, 5, static_cast<uint32_t>(6 + i)}, 4), kClientDeadline);
    const absl::Duration took = absl::Now() - t0;
    std::printf("request %d: %s in %s\n", i, r.status.error_message().c_str(),
                absl::FormatDuration(took).c_str());
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << "request " << i << " after " << took << ": " << r.status.error_message();
    EXPECT_LT(took, kNoticed) << "request " << i;
    EXPECT_LE(r.tokens.size(), 1u);  // P's first token at most, never repeated
  }
}

// The router's replies to a client black-holed mid-stream (the client's host gone, its link
// dropped): the public port's keepalive (300 + 300 ms here, 20 s + 20 s by default) closes the
// connection, which cancels the request and its decode call. Before, the port never pinged, and
// the stream and the worker call behind it stayed until gRPC's TCP_USER_TIMEOUT (20 s) with data
// unacknowledged, or the request's deadline when nothing was being sent.
TEST_F(PartitionTest, AClientWhoseRepliesAreBlackHoledIsCutOff) {
  RouterOptions options = TestRouterOptions();
  options.internal_listen = "127.0.0.1:0";  // the workers' heartbeats on a port not dropped
  options.grpc_ports.keepalive_time = absl::Milliseconds(300);
  options.grpc_ports.keepalive_timeout = absl::Milliseconds(300);
  RouterHarness h(options);
  h.AddWorker("p0", WORKER_ROLE_PREFILL, [](FakeWorkerOptions& o) { o.max_model_len = 1 << 20; });
  FakeWorker* d0 = h.AddWorker("d0", WORKER_ROLE_DECODE, [](FakeWorkerOptions& o) {
    o.token_delay = absl::Milliseconds(100);
    o.max_model_len = 1 << 20;
  });
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = h.stub().Generate(&context, MakeRequest({1, 2, 3}, 100000));
  v1::GenerateResponse chunk;
  int tokens = 0;
  while (tokens < 3 && reader->Read(&chunk)) tokens += chunk.token_ids_size();
  ASSERT_GE(tokens, 3);
  ASSERT_EQ(d0->open_streams(), 1);
  ASSERT_TRUE(DropPackets(PortOf(h.address()), DropDirection::kFromPort).ok());
  const absl::Time t0 = absl::Now();
  while (d0->open_streams() > 0 && absl::Now() - t0 < kNoticed) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration took = absl::Now() - t0;
  std::printf("decode stream ended %s after the drop\n", absl::FormatDuration(took).c_str());
  EXPECT_EQ(d0->open_streams(), 0) << "the decode call outlived its client";
  EXPECT_LT(took, kNoticed);
  context.TryCancel();
  reader->Finish();
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // First, while the process has one thread: every thread started later (gRPC's too) lives in
  // the namespace, and the drops never reach the host's loopback.
  tandem::router::Namespace() = tandem::router::EnterDroppingNetworkNamespace();
  if (!tandem::router::Namespace().ok()) {
    std::fprintf(stderr, "partition_test: %s; the tests skip\n",
                 tandem::router::Namespace().ToString().c_str());
  }
  return RUN_ALL_TESTS();
}
