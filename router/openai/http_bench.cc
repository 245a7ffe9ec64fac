// http_bench: the router's OpenAI HTTP API under many concurrent streaming chat requests, against
// fake workers (real gRPC). Reports requests/s, time to first SSE chunk and to [DONE] (p50/p99),
// the latency the HTTP layer adds over the gRPC Router API for one request at a time, and the
// router process's threads and RSS at the peak; then the same number of concurrent streams
// through the gRPC Router API (callback client). Fails (exit 1) when a stream did not complete
// or the router's thread count exceeded --max_threads: neither the open streams nor the
// requests generating at once may cost a thread each.
//
// The fake workers run in a child process (forked before any thread starts), so the threads and
// RSS measured are the router's alone: a fake worker's synchronous gRPC server holds a thread
// per open stream, which is the fake's cost, not the router's.
//
//   bazel run -c opt //router/openai:http_bench -- [--streams=2000] [--tokens=16]
//       [--token_delay_ms=2] [--max_running=4096] [--max_threads=64] [--grpc=true]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "router/openai/http_api.h"
#include "router/testing/router_test_util.h"

ABSL_FLAG(int, streams, 2000, "concurrent streaming chat requests");
ABSL_FLAG(int, tokens, 16, "max_tokens per request");
ABSL_FLAG(int, token_delay_ms, 2, "fake workers' delay per token");
ABSL_FLAG(int, max_running, 4096, "HTTP requests generating at once (HttpApiOptions)");
ABSL_FLAG(int, max_threads, 64, "fail when the router process's peak thread count exceeds this");
ABSL_FLAG(std::string, model_dir, "", "tokenizer directory (default: a Qwen2.5 fixture copy)");
ABSL_FLAG(bool, grpc, true, "also run --streams concurrent gRPC Router.Generate streams");
ABSL_FLAG(int, sequential, 50, "requests one at a time per API for the added-latency figure");

namespace tandem::router::openai {
namespace {

int64_t ProcStatus(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The worker process: two fake mixed workers registering with the router whose address (and
// the vocabulary size) arrive on `fd`; they run until the parent closes it (or dies).
int RunWorkers(int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  std::istringstream in(line);
  std::string router;
  uint32_t vocab = 0;
  in >> router >> vocab;
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (const char* id : {"w0", "w1"}) {
    FakeWorkerOptions o;
    o.worker_id = id;
    o.role = v1::WORKER_ROLE_MIXED;
    o.router_address = router;
    o.vocab_size = vocab;
    o.token_delay = absl::Milliseconds(absl::GetFlag(FLAGS_token_delay_ms));
    auto w = FakeWorker::Start(o);
    if (!w.ok()) return 1;
    workers.push_back(*std::move(w));
  }
  while (read(fd, &c, 1) > 0) {
  }
  for (auto& w : workers) w->Kill();
  std::_Exit(0);
}

struct Conn {
  int fd = -1;
  std::string out, in;
  size_t sent = 0;
  absl::Time start, first, done;
  bool finished = false;
};

struct Peak {
  int64_t threads = 0;
  int64_t rss_kib = 0;
  void Sample() {
    threads = std::max(threads, ProcStatus("Threads"));
    rss_kib = std::max(rss_kib, ProcStatus("VmRSS"));
  }
};

// One poll() client: opens every connection of `batch`, writes `request` on each, reads until
// [DONE] or EOF. False when some did not finish within 5 minutes.
bool RunBatch(int port, const std::string& request, std::vector<Conn>& batch, Peak& peak) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (Conn& c : batch) {
    c = Conn();
    c.fd = socket(AF_INET, SOCK_STREAM, 0);
    c.start = absl::Now();
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return false;
    fcntl(c.fd, F_SETFL, O_NONBLOCK);
    c.out = request;
  }
  size_t left = batch.size();
  std::vector<pollfd> fds(batch.size());
  char buf[16384];
  const absl::Time give_up = absl::Now() + absl::Minutes(5);
  while (left > 0 && absl::Now() < give_up) {
    for (size_t i = 0; i < batch.size(); ++i) {
      const Conn& c = batch[i];
      fds[i] = {c.finished ? -1 : c.fd,
                static_cast<int16_t>(POLLIN | (c.sent < c.out.size() ? POLLOUT : 0)), 0};
    }
    poll(fds.data(), fds.size(), 100);
    peak.Sample();
    for (size_t i = 0; i < batch.size(); ++i) {
      Conn& c = batch[i];
      if (c.finished) continue;
      if ((fds[i].revents & POLLOUT) && c.sent < c.out.size()) {
        const ssize_t w = write(c.fd, c.out.data() + c.sent, c.out.size() - c.sent);
        if (w > 0) c.sent += w;
      }
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t r = read(c.fd, buf, sizeof(buf));
      if (r > 0) {
        c.in.append(buf, r);
        if (c.first == absl::Time() && c.in.find("data: {") != std::string::npos) {
          c.first = absl::Now();
        }
      }
      if (r == 0 || c.in.find("data: [DONE]") != std::string::npos) {
        c.done = absl::Now();
        c.finished = true;
        close(c.fd);
        --left;
      }
    }
  }
  return left == 0;
}

absl::StatusOr<std::unique_ptr<ServedModel>> LoadModel() {
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    dir = "/tmp/tandem-http-bench-model";
    if (std::system(
            absl::StrCat("deploy/local/make_text_model.sh ", dir, " > /dev/null").c_str()) != 0) {
      return absl::FailedPreconditionError(
          "make_text_model.sh failed (run from the repository root)");
    }
  }
  return ServedModel::Load(dir, "bench");
}

// Prints a concurrent run's numbers (`ttft`, `e2e` in ms of the completed streams); false when a
// stream did not complete.
bool Report(const char* what, size_t streams, std::vector<double> ttft, std::vector<double> e2e,
            double wall, const Peak& peak, int64_t threads_before) {
  const size_t ok = e2e.size();
  std::printf("%zu concurrent %s: %zu completed in %.2f s = %.1f req/s\n", streams, what, ok, wall,
              ok / wall);
  std::printf("  first chunk p50 %.1f ms p99 %.1f ms; end p50 %.1f ms p99 %.1f ms\n",
              Pct(ttft, 0.5), Pct(ttft, 0.99), Pct(e2e, 0.5), Pct(e2e, 0.99));
  std::printf("  router threads: %lld before, %lld at the peak (+%lld); peak RSS %.1f MiB\n",
              static_cast<long long>(threads_before), static_cast<long long>(peak.threads),
              static_cast<long long>(peak.threads - threads_before), peak.rss_kib / 1024.0);
  return ok == streams;
}

// Every HTTP stream opened and its request written at once.
bool ConcurrentHttp(int port, const std::string& request, int max_running, Peak& peak) {
  std::vector<Conn> conns(absl::GetFlag(FLAGS_streams));
  const int64_t before = ProcStatus("Threads");
  const absl::Time start = absl::Now();
  RunBatch(port, request, conns, peak);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> ttft, e2e;
  for (const Conn& c : conns) {
    if (c.in.find("HTTP/1.1 200") != 0 || c.in.find("data: [DONE]") == std::string::npos) continue;
    ttft.push_back(absl::ToDoubleMilliseconds(c.first - c.start));
    e2e.push_back(absl::ToDoubleMilliseconds(c.done - c.start));
  }
  const std::string what = absl::StrCat("HTTP chat streams (max_running ", max_running, ")");
  return Report(what.c_str(), conns.size(), ttft, e2e, wall, peak, before);
}

// One Router.Generate stream read by a callback reactor: the client holds no thread either.
class GrpcStream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GrpcStream(v1::Router::Stub& stub, v1::GenerateRequest request, absl::BlockingCounter* left)
      : request_(std::move(request)), left_(left), start_(absl::Now()) {
    ctx_.set_deadline(absl::ToChronoTime(start_ + absl::Minutes(5)));
    stub.async()->Generate(&ctx_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (first_ == absl::InfinitePast()) first_ = absl::Now();
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& s) override {
    ok_ = s.ok() && first_ != absl::InfinitePast();
    done_ = absl::Now();
    left_->DecrementCount();
  }
  bool ok() const { return ok_; }
  double ttft_ms() const { return absl::ToDoubleMilliseconds(first_ - start_); }
  double e2e_ms() const { return absl::ToDoubleMilliseconds(done_ - start_); }

 private:
  grpc::ClientContext ctx_;
  const v1::GenerateRequest request_;
  absl::BlockingCounter* const left_;
  const absl::Time start_;
  v1::GenerateResponse chunk_;
  absl::Time first_ = absl::InfinitePast(), done_;
  bool ok_ = false;
};

// The same number of streams through the gRPC Router API (token ids in, token ids out).
bool ConcurrentGrpc(RouterHarness& harness, const std::vector<uint32_t>& prompt, int tokens,
                    Peak& peak) {
  const int n = absl::GetFlag(FLAGS_streams);
  const int64_t before = ProcStatus("Threads");
  absl::BlockingCounter left(n);
  std::vector<std::unique_ptr<GrpcStream>> streams;
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    streams.push_back(
        std::make_unique<GrpcStream>(harness.stub(), MakeRequest(prompt, tokens), &left));
  }
  peak.Sample();
  absl::Notification all_done;
  std::thread waiter([&] {
    left.Wait();
    all_done.Notify();
  });
  while (!all_done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) peak.Sample();
  waiter.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> ttft, e2e;
  for (const auto& s : streams) {
    if (!s->ok()) continue;
    ttft.push_back(s->ttft_ms());
    e2e.push_back(s->e2e_ms());
  }
  return Report("gRPC Generate streams", streams.size(), ttft, e2e, wall, peak, before);
}

int Run(int workers_fd) {
  RouterOptions router_options = TestRouterOptions();
  router_options.max_queue = 100000;
  RouterHarness harness(router_options);
  auto model = LoadModel();
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const std::string hello = absl::StrCat(harness.server().internal_address(), " ",
                                         (*model)->tokenizer->vocab_size(), "\n");
  if (write(workers_fd, hello.data(), hello.size()) != static_cast<ssize_t>(hello.size()) ||
      !harness.WaitForHealth("w0", true) || !harness.WaitForHealth("w1", true)) {
    std::fprintf(stderr, "the fake workers did not register\n");
    return 1;
  }
  HttpApiOptions options;
  options.max_running = absl::GetFlag(FLAGS_max_running);
  options.max_pending = 1 << 20;
  auto api = HttpApi::Start(options, *std::move(model), &harness.server().registry(),
                            &harness.server().requests(), &harness.server().orchestrator());
  if (!api.ok()) return 1;
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const std::string body = absl::StrCat(
      R"({"model": "bench", "stream": true, "max_tokens": )", tokens,
      R"(, "messages": [{"role": "user", "content": "Tell me a story about a robot."}]})");
  const std::string request = absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n",
      "Content-Length: ", body.size(), "\r\n\r\n", body);
  // Added latency, one request at a time: HTTP (SSE) vs the gRPC Router API, same prompt length.
  std::vector<double> http_one, grpc_one;
  auto ids = (*api)->model().tokenizer->Encode("Tell me a story about a robot.", true);
  const std::vector<uint32_t> prompt(ids->begin(), ids->end());
  Peak peak;  // over the whole run; each concurrent run also reports its own
  const int sequential = std::max(1, absl::GetFlag(FLAGS_sequential));
  for (int i = 0; i < sequential; ++i) {
    const absl::Time t = absl::Now();
    harness.Generate(MakeRequest(prompt, tokens));
    grpc_one.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
    std::vector<Conn> one(1);
    RunBatch((*api)->port(), request, one, peak);
    http_one.push_back(absl::ToDoubleMilliseconds(one[0].done - one[0].start));
  }
  std::printf(
      "one at a time (%d each, %d tokens): gRPC p50 %.2f ms, HTTP+SSE p50 %.2f ms "
      "(added %.2f ms), p99 %.2f / %.2f ms\n",
      sequential, tokens, Pct(grpc_one, 0.5), Pct(http_one, 0.5),
      Pct(http_one, 0.5) - Pct(grpc_one, 0.5), Pct(grpc_one, 0.99), Pct(http_one, 0.99));
  Peak http_peak, grpc_peak;
  bool complete = ConcurrentHttp((*api)->port(), request, options.max_running, http_peak);
  if (absl::GetFlag(FLAGS_grpc)) complete &= ConcurrentGrpc(harness, prompt, tokens, grpc_peak);
  peak.threads = std::max({peak.threads, http_peak.threads, grpc_peak.threads});
  const int64_t max_threads = absl::GetFlag(FLAGS_max_threads);
  if (!complete || peak.threads > max_threads) {
    std::printf("FAIL: %s\n", !complete
                                  ? "not every stream completed"
                                  : absl::StrCat("the router's thread count reached ", peak.threads,
                                                 " > --max_threads=", max_threads)
                                        .c_str());
    return 1;
  }
  std::printf("PASS: peak %lld router threads <= --max_threads=%lld\n",
              static_cast<long long>(peak.threads), static_cast<long long>(max_threads));
  return 0;
}

}  // namespace
}  // namespace tandem::router::openai

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The workers' process first, while this one has no thread yet (fork copies only the caller).
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(pipe_fds[1]);
    return tandem::router::openai::RunWorkers(pipe_fds[0]);
  }
  close(pipe_fds[0]);
  const int rc = tandem::router::openai::Run(pipe_fds[1]);
  close(pipe_fds[1]);  // the workers stop
  waitpid(child, nullptr, 0);
  return rc;
}
