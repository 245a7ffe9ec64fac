// link_drop_probe: a real network drop between the router and one worker, by hand (not CI). In a
// network namespace of its own (router/testing/link_drop.h: run it as root; the host's
// interfaces are never touched), it starts a router (RouterHarness) with a prefill and a decode
// fake worker, drops every packet to and from the victim's gRPC port for --hold_s seconds while
// a long request streams from D, optionally sends one request during the drop (--during, so the
// router's channel to the victim is reconnecting when the drop ends), then sends 8 requests
// 0.5 s apart from the moment the drop ends and prints each outcome:
//
//   bazel build //router/grpc:link_drop_probe
//   sudo bazel-bin/router/grpc/link_drop_probe --victim=decode --hold_s=10 [--during]
//
// The heartbeat interval is the daemon's default (1 s), so failure backoffs are real-sized.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "router/testing/fake_worker.h"
#include "router/testing/link_drop.h"
#include "router/testing/router_test_util.h"

namespace tandem::router {
namespace {

void Drop(int port, bool on) {
  const absl::Status s = on ? DropPackets(port, DropDirection::kBoth) : StopDropping();
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
}

void Report(const std::string& what, absl::Time t, const StreamResult& r) {
  std::printf("%s: %s in %.2f s, %zu tokens %s\n", what.c_str(), r.status.ok() ? "OK" : "FAILED",
              absl::ToDoubleSeconds(absl::Now() - t), r.tokens.size(),
              r.status.error_message().c_str());
  std::fflush(stdout);
}

int Probe(bool drop_decode, absl::Duration hold, bool during) {
  RouterOptions options = TestRouterOptions();
  options.registry.heartbeat_interval = absl::Seconds(1);
  RouterHarness h(options);
  FakeWorker* p = h.AddWorker("p0", v1::WORKER_ROLE_PREFILL);
  FakeWorker* d = h.AddWorker("d0", v1::WORKER_ROLE_DECODE,
                              [](FakeWorkerOptions& o) { o.token_delay = absl::Milliseconds(10); });
  const std::string& victim = (drop_decode ? d : p)->address();
  const int port = std::stoi(victim.substr(victim.rfind(':') + 1));
  if (!h.Generate(MakeRequest({1, 2, 3}, 4)).status.ok()) return 1;
  std::thread streaming([&] {
    const absl::Time t = absl::Now();
    Report("streaming when the drop began", t, h.Generate(MakeRequest({4, 5, 6}, 1000)));
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time dropped = absl::Now();
  Drop(port, true);
  if (during) {
    absl::SleepFor(absl::Seconds(3));
    const absl::Time t = absl::Now();
    Report("request 3 s into the drop", t, h.Generate(MakeRequest({3, 3, 3}, 5), hold));
  }
  absl::SleepFor(dropped + hold - absl::Now());
  Drop(port, false);
  const absl::Time undropped = absl::Now();
  for (int i = 0; i < 8; ++i) {
    const absl::Time t = absl::Now();
    const StreamResult r = h.Generate(MakeRequest({7, 8, uint32_t(9 + i)}, 5), absl::Seconds(30));
    Report(
        absl::StrFormat("request at +%.2f s after the drop", absl::ToDoubleSeconds(t - undropped)),
        t, r);
    absl::SleepFor(absl::Milliseconds(500));
  }
  streaming.join();
  return 0;
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  bool drop_decode = true, during = false;
  double hold_s = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--victim=prefill") {
      drop_decode = false;
    } else if (arg == "--victim=decode") {
      drop_decode = true;
    } else if (arg == "--during") {
      during = true;
    } else if (arg.rfind("--hold_s=", 0) == 0) {
      hold_s = std::atof(arg.c_str() + 9);
    } else {
      std::fprintf(stderr, "usage: %s [--victim=decode|prefill] [--hold_s=10] [--during]\n",
                   argv[0]);
      return 2;
    }
  }
  // Before any thread starts: the drop rules must never reach the host's loopback.
  if (absl::Status s = tandem::router::EnterDroppingNetworkNamespace(); !s.ok()) {
    std::fprintf(stderr, "%s (run as root)\n", s.ToString().c_str());
    return 1;
  }
  return tandem::router::Probe(drop_decode, absl::Seconds(hold_s), during);
}
