// link_drop_probe: a real network drop between the router and one worker, by hand (not CI). In a
// network namespace of its own (router/testing/link_drop.h: run it as root; the host's
// interfaces are never touched), it starts a router (RouterHarness) with a prefill and a decode
// fake worker (--victim=prefill|decode) or one mixed worker (--victim=mixed), drops every packet
// to and from the victim's gRPC port (--one_way=to|from: only those to it, or only its replies)
// for --hold_s seconds while a long request streams from it, optionally sends one request during
// the drop (--during, 3 s in, client deadline 30 s, so the router's channel to the victim is
// reconnecting when the drop ends), then sends 8 requests 0.5 s apart from the moment the drop
// ends and prints each outcome:
//
//   bazel build //router/grpc:link_drop_probe
//   sudo bazel-bin/router/grpc/link_drop_probe --victim=decode --hold_s=10 [--during]
//        [--one_way=to|from] [--decode_wait_ms=20000]
//
// The heartbeat interval is the daemon's default (1 s), so failure backoffs are real-sized;
// --decode_wait_ms sets OrchestratorOptions::decode_wait (the daemon's --decode_wait_ms).
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

struct ProbeOptions {
  v1::WorkerRole victim = v1::WORKER_ROLE_DECODE;
  DropDirection direction = DropDirection::kBoth;
  absl::Duration hold = absl::Seconds(10);
  absl::Duration decode_wait = OrchestratorOptions().decode_wait;
  bool during = false;
};

void Drop(int port, DropDirection direction, bool on) {
  const absl::Status s = on ? DropPackets(port, direction) : StopDropping();
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
}

void Report(const std::string& what, absl::Time t, const StreamResult& r) {
  std::printf("%s: %s in %.2f s, %zu tokens %s\n", what.c_str(), r.status.ok() ? "OK" : "FAILED",
              absl::ToDoubleSeconds(absl::Now() - t), r.tokens.size(),
              r.status.error_message().c_str());
  std::fflush(stdout);
}

int Probe(const ProbeOptions& probe) {
  RouterOptions options = TestRouterOptions();
  options.registry.heartbeat_interval = absl::Seconds(1);
  options.orchestrator.decode_wait = probe.decode_wait;
  RouterHarness h(options);
  const auto slow = [](FakeWorkerOptions& o) { o.token_delay = absl::Milliseconds(10); };
  FakeWorker* victim = nullptr;
  if (probe.victim == v1::WORKER_ROLE_MIXED) {
    victim = h.AddWorker("m0", v1::WORKER_ROLE_MIXED, slow);
  } else {
    FakeWorker* p = h.AddWorker("p0", v1::WORKER_ROLE_PREFILL);
    FakeWorker* d = h.AddWorker("d0", v1::WORKER_ROLE_DECODE, slow);
    victim = probe.victim == v1::WORKER_ROLE_PREFILL ? p : d;
  }
  const std::string& address = victim->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const absl::Duration hold = probe.hold;
  if (!h.Generate(MakeRequest({1, 2, 3}, 4)).status.ok()) return 1;
  std::thread streaming([&] {
    const absl::Time t = absl::Now();
    Report("streaming when the drop began", t, h.Generate(MakeRequest({4, 5, 6}, 1000)));
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time dropped = absl::Now();
  Drop(port, probe.direction, true);
  // Its own thread: the drop ends on time whatever the request waits for.
  std::thread during([&] {
    if (!probe.during) return;
    absl::SleepFor(absl::Seconds(3));
    const absl::Time t = absl::Now();
    const StreamResult r = h.Generate(MakeRequest({3, 3, 3}, 5), absl::Seconds(30));
    Report(absl::StrFormat("request 3 s into the drop (ended %+.2f s after the drop)",
                           absl::ToDoubleSeconds(absl::Now() - (dropped + hold))),
           t, r);
  });
  absl::SleepFor(dropped + hold - absl::Now());
  Drop(port, probe.direction, false);
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
  during.join();
  return 0;
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  using tandem::router::DropDirection;
  tandem::router::ProbeOptions probe;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--victim=prefill") {
      probe.victim = tandem::v1::WORKER_ROLE_PREFILL;
    } else if (arg == "--victim=decode") {
      probe.victim = tandem::v1::WORKER_ROLE_DECODE;
    } else if (arg == "--victim=mixed") {
      probe.victim = tandem::v1::WORKER_ROLE_MIXED;
    } else if (arg == "--during") {
      probe.during = true;
    } else if (arg == "--one_way=to" || arg == "--one_way=from") {
      probe.direction = arg == "--one_way=to" ? DropDirection::kToPort : DropDirection::kFromPort;
    } else if (arg.rfind("--hold_s=", 0) == 0) {
      probe.hold = absl::Seconds(std::atof(arg.c_str() + 9));
    } else if (arg.rfind("--decode_wait_ms=", 0) == 0) {
      probe.decode_wait = absl::Milliseconds(std::atoi(arg.c_str() + 17));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--victim=decode|prefill|mixed] [--hold_s=10] [--during] "
                   "[--one_way=to|from] [--decode_wait_ms=N]\n",
                   argv[0]);
      return 2;
    }
  }
  // Before any thread starts: the drop rules must never reach the host's loopback.
  if (absl::Status s = tandem::router::EnterDroppingNetworkNamespace(); !s.ok()) {
    std::fprintf(stderr, "%s (run as root)\n", s.ToString().c_str());
    return 1;
  }
  return tandem::router::Probe(probe);
}
