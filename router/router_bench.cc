// //router:router_bench — what the router adds on top of the workers it calls.
//
//   router_bench [--requests=2000] [--concurrency=16] [--max_tokens=8] [--prompt_len=64]
//
// Everything runs in this process over loopback gRPC: fake workers that answer instantly
// (fake_worker.h), and two routers, one in front of a prefill + a decode worker, one in front of
// a mixed worker. For each path it measures end-to-end latency of whole requests, one at a time
// (p50/p99), and throughput with `concurrency` closed-loop clients, against calling the workers
// directly the way the router would (Prefill then Decode with the handle; or Generate). The
// difference is the router's overhead: one more hop, routing (incl. SHA-256 prompt hashing),
// validation and relaying. Client, router and workers share the machine's cores.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "router/grpc/router_server.h"
#include "router/testing/fake_worker.h"

ABSL_FLAG(int32_t, requests, 2000, "requests per measurement");
ABSL_FLAG(int32_t, concurrency, 16, "closed-loop clients for the throughput measurement");
ABSL_FLAG(uint32_t, max_tokens, 8, "tokens per request");
ABSL_FLAG(int32_t, prompt_len, 64, "prompt tokens per request");

namespace tandem::router {
namespace {

// One whole request; false on any error.
using RequestFn = std::function<bool(const v1::GenerateRequest&)>;

bool Drain(grpc::ClientReaderInterface<v1::GenerateResponse>& reader) {
  v1::GenerateResponse chunk;
  bool finished = false;
  while (reader.Read(&chunk)) finished |= chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  return reader.Finish().ok() && finished;
}

RequestFn ViaRouter(v1::Router::Stub* stub) {
  return [stub](const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    return Drain(*reader);
  };
}

RequestFn DirectPrefillDecode(v1::WorkerService::Stub* p, v1::WorkerService::Stub* d) {
  return [p, d](const v1::GenerateRequest& req) {
    v1::PrefillRequest preq;
    *preq.mutable_request() = req;
    preq.set_remote_decode(true);
    v1::PrefillResponse presp;
    grpc::ClientContext pctx;
    if (!p->Prefill(&pctx, preq, &presp).ok()) return false;
    if (presp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) return true;
    v1::DecodeRequest dreq;
    *dreq.mutable_request() = req;
    dreq.set_first_token(presp.first_token());
    *dreq.mutable_kv_handle() = presp.kv_handle();
    grpc::ClientContext dctx;
    auto reader = d->Decode(&dctx, dreq);
    return Drain(*reader);
  };
}

RequestFn DirectMixed(v1::WorkerService::Stub* m) {
  return [m](const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = m->Generate(&ctx, req);
    return Drain(*reader);
  };
}

struct Latency {
  double p50_ms = 0, p99_ms = 0;
  int errors = 0;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

v1::GenerateRequest Request(int i) {
  v1::GenerateRequest req;
  // Distinct prompts: no prefix-cache effects, every request hashes its whole prompt.
  for (int t = 0; t < absl::GetFlag(FLAGS_prompt_len); ++t) {
    req.add_prompt_token_ids(static_cast<uint32_t>((i * 7919 + t * 31) % 1000));
  }
  req.mutable_sampling()->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  req.mutable_sampling()->set_ignore_eos(true);
  return req;
}

Latency Sequential(const RequestFn& fn, int n) {
  for (int i = 0; i < std::min(n, 100); ++i) fn(Request(i));  // warm-up
  std::vector<double> ms;
  Latency out;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    if (!fn(Request(i))) ++out.errors;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  out.p50_ms = Percentile(ms, 0.5);
  out.p99_ms = Percentile(ms, 0.99);
  return out;
}

// Requests per second with `clients` closed-loop threads sharing `n` requests.
double Throughput(const RequestFn& fn, int n, int clients, int* errors) {
  std::atomic<int> next{0}, failed{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        if (!fn(Request(i))) ++failed;
      }
    });
  }
  for (auto& t : threads) t.join();
  *errors += failed.load();
  return n / absl::ToDoubleSeconds(absl::Now() - start);
}

std::unique_ptr<FakeWorker> StartWorker(const std::string& id, v1::WorkerRole role,
                                        const std::string& router) {
  FakeWorkerOptions o;
  o.worker_id = id;
  o.role = role;
  o.router_address = router;
  auto w = FakeWorker::Start(o);
  if (!w.ok()) {
    std::fprintf(stderr, "router_bench: %s\n", w.status().ToString().c_str());
    std::exit(1);
  }
  (*w)->WaitForHeartbeats(1, absl::Seconds(30));
  return *std::move(w);
}

std::unique_ptr<v1::WorkerService::Stub> WorkerStub(const FakeWorker& w) {
  return v1::WorkerService::NewStub(
      grpc::CreateChannel(w.address(), grpc::InsecureChannelCredentials()));
}

int Main() {
  RouterOptions options;
  options.registry.heartbeat_interval = absl::Milliseconds(200);
  options.max_queue = 4096;
  auto pd_router = RouterServer::Start(options);
  auto mixed_router = RouterServer::Start(options);
  if (!pd_router.ok() || !mixed_router.ok()) {
    std::fprintf(stderr, "router_bench: cannot start the routers\n");
    return 1;
  }
  auto p = StartWorker("p0", v1::WORKER_ROLE_PREFILL, (*pd_router)->address());
  auto d = StartWorker("d0", v1::WORKER_ROLE_DECODE, (*pd_router)->address());
  auto m = StartWorker("m0", v1::WORKER_ROLE_MIXED, (*mixed_router)->address());
  auto pd_stub = v1::Router::NewStub(
      grpc::CreateChannel((*pd_router)->address(), grpc::InsecureChannelCredentials()));
  auto mixed_stub = v1::Router::NewStub(
      grpc::CreateChannel((*mixed_router)->address(), grpc::InsecureChannelCredentials()));
  auto p_stub = WorkerStub(*p), d_stub = WorkerStub(*d), m_stub = WorkerStub(*m);

  const int n = absl::GetFlag(FLAGS_requests);
  const int clients = absl::GetFlag(FLAGS_concurrency);
  std::printf("router_bench: %d requests, prompt %d tokens, %u output tokens, %u cores\n", n,
              absl::GetFlag(FLAGS_prompt_len), absl::GetFlag(FLAGS_max_tokens),
              std::thread::hardware_concurrency());
  std::printf("%-16s %-8s %10s %10s %14s %14s %12s\n", "path", "via", "p50_ms", "p99_ms",
              "added_p50_ms", "added_p99_ms", ("req/s@" + std::to_string(clients)).c_str());
  struct Path {
    const char* name;
    RequestFn direct, routed;
  };
  const std::vector<Path> paths = {
      {"prefill+decode", DirectPrefillDecode(p_stub.get(), d_stub.get()), ViaRouter(pd_stub.get())},
      {"mixed", DirectMixed(m_stub.get()), ViaRouter(mixed_stub.get())},
  };
  int errors = 0;
  for (const Path& path : paths) {
    const Latency direct = Sequential(path.direct, n);
    const Latency routed = Sequential(path.routed, n);
    const double direct_rps = Throughput(path.direct, n, clients, &errors);
    const double routed_rps = Throughput(path.routed, n, clients, &errors);
    errors += direct.errors + routed.errors;
    std::printf("%-16s %-8s %10.3f %10.3f %14s %14s %12.0f\n", path.name, "direct", direct.p50_ms,
                direct.p99_ms, "-", "-", direct_rps);
    std::printf("%-16s %-8s %10.3f %10.3f %14.3f %14.3f %12.0f\n", path.name, "router",
                routed.p50_ms, routed.p99_ms, routed.p50_ms - direct.p50_ms,
                routed.p99_ms - direct.p99_ms, routed_rps);
  }
  std::printf("errors: %d\n", errors);
  m.reset();
  d.reset();
  p.reset();
  (*pd_router)->Shutdown(absl::ZeroDuration());
  (*mixed_router)->Shutdown(absl::ZeroDuration());
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::LoggingOptions logging;
  logging.min_log_level = 1;  // registrations would clutter the table
  if (!tandem::InitLogging(argv[0], logging).ok()) return 1;
  return tandem::router::Main();
}
