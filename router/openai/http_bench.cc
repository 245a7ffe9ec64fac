// http_bench: the router's OpenAI HTTP API under many concurrent streaming chat requests, against
// fake workers (real gRPC, in this process). Reports requests/s, time to first SSE chunk and to
// [DONE] (p50/p99), the latency the HTTP layer adds over the gRPC Router API for one request at a
// time, and the process's threads and RSS at the peak — and fails (exit 1) when the thread count
// grows past --max_threads (the HTTP plane must not hold a thread per open stream).
//
//   bazel run -c opt //router/openai:http_bench -- [--streams=2000] [--tokens=16]
//       [--token_delay_ms=2] [--max_running=64] [--max_threads=...]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/openai/http_api.h"
#include "router/router_test_util.h"

ABSL_FLAG(int, streams, 2000, "concurrent streaming chat requests");
ABSL_FLAG(int, tokens, 16, "max_tokens per request");
ABSL_FLAG(int, token_delay_ms, 2, "fake workers' delay per token");
ABSL_FLAG(int, max_running, 64, "HTTP generation threads (HttpApiOptions::max_running)");
ABSL_FLAG(int, max_threads, 0, "fail when the peak thread count exceeds this (0: 3 x max_running)");
ABSL_FLAG(std::string, model_dir, "", "tokenizer directory (default: a Qwen2.5 fixture copy)");

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

struct Conn {
  int fd = -1;
  std::string out, in;
  size_t sent = 0;
  absl::Time start, first, done;
  bool finished = false;
};

int Run() {
  RouterOptions router_options = TestRouterOptions();
  router_options.max_queue = 100000;
  RouterHarness harness(router_options);
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    dir = "/tmp/tandem-http-bench-model";
    if (std::system(
            absl::StrCat("deploy/local/make_text_model.sh ", dir, " > /dev/null").c_str()) != 0) {
      std::fprintf(stderr, "make_text_model.sh failed (run from the repository root)\n");
      return 1;
    }
  }
  auto model = ServedModel::Load(dir, "bench");
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const uint32_t vocab = static_cast<uint32_t>((*model)->tokenizer->vocab_size());
  for (const char* id : {"w0", "w1"}) {
    harness.AddWorker(id, v1::WORKER_ROLE_MIXED, [&](FakeWorkerOptions& o) {
      o.vocab_size = vocab;
      o.token_delay = absl::Milliseconds(absl::GetFlag(FLAGS_token_delay_ms));
    });
  }
  HttpApiOptions options;
  options.max_running = absl::GetFlag(FLAGS_max_running);
  options.max_pending = 1 << 20;
  const int64_t threads_before = ProcStatus("Threads");
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
  for (int i = 0; i < 50; ++i) {
    const absl::Time t = absl::Now();
    v1::GenerateRequest g = MakeRequest(std::vector<uint32_t>(ids->begin(), ids->end()), tokens);
    harness.Generate(g);
    grpc_one.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  // The concurrent run: every connection opened and its request written at once.
  const int n = absl::GetFlag(FLAGS_streams);
  std::vector<Conn> conns(n);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*api)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto run_batch = [&](std::vector<Conn>& batch, int64_t* peak_threads, int64_t* peak_rss) {
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
        fds[i] = {
            batch[i].finished ? -1 : batch[i].fd,
            static_cast<int16_t>(POLLIN | (batch[i].sent < batch[i].out.size() ? POLLOUT : 0)), 0};
      }
      poll(fds.data(), fds.size(), 100);
      *peak_threads = std::max(*peak_threads, ProcStatus("Threads"));
      *peak_rss = std::max(*peak_rss, ProcStatus("VmRSS"));
      for (size_t i = 0; i < batch.size(); ++i) {
        Conn& c = batch[i];
        if (c.finished) continue;
        if ((fds[i].revents & POLLOUT) && c.sent < c.out.size()) {
          const ssize_t w = write(c.fd, c.out.data() + c.sent, c.out.size() - c.sent);
          if (w > 0) c.sent += w;
        }
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
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
    }
    return left == 0;
  };
  for (int i = 0; i < 50; ++i) {
    std::vector<Conn> one(1);
    int64_t t = 0, r = 0;
    run_batch(one, &t, &r);
    http_one.push_back(absl::ToDoubleMilliseconds(one[0].done - one[0].start));
  }
  int64_t peak_threads = 0, peak_rss = 0;
  const absl::Time start = absl::Now();
  const bool all = run_batch(conns, &peak_threads, &peak_rss);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> ttft, e2e;
  int ok = 0;
  for (const Conn& c : conns) {
    if (c.in.find("HTTP/1.1 200") != 0 || c.in.find("data: [DONE]") == std::string::npos) continue;
    ++ok;
    ttft.push_back(absl::ToDoubleMilliseconds(c.first - c.start));
    e2e.push_back(absl::ToDoubleMilliseconds(c.done - c.start));
  }
  std::printf(
      "one at a time (50 each, %d tokens): gRPC p50 %.2f ms, HTTP+SSE p50 %.2f ms "
      "(added %.2f ms), p99 %.2f / %.2f ms\n",
      tokens, Pct(grpc_one, 0.5), Pct(http_one, 0.5), Pct(http_one, 0.5) - Pct(grpc_one, 0.5),
      Pct(grpc_one, 0.99), Pct(http_one, 0.99));
  std::printf("%d concurrent streams, max_running %d: %d completed%s in %.2f s = %.1f req/s\n", n,
              options.max_running, ok, all ? "" : " (some timed out)", wall, ok / wall);
  std::printf("  first chunk p50 %.1f ms p99 %.1f ms; [DONE] p50 %.1f ms p99 %.1f ms\n",
              Pct(ttft, 0.5), Pct(ttft, 0.99), Pct(e2e, 0.5), Pct(e2e, 0.99));
  const int max_threads = absl::GetFlag(FLAGS_max_threads) > 0 ? absl::GetFlag(FLAGS_max_threads)
                                                               : 3 * options.max_running;
  std::printf("  threads: %lld before the API, %lld at the peak (+%lld); peak RSS %.1f MiB\n",
              static_cast<long long>(threads_before), static_cast<long long>(peak_threads),
              static_cast<long long>(peak_threads - threads_before), peak_rss / 1024.0);
  if (peak_threads - threads_before > max_threads || ok != n) {
    std::printf("FAIL: %s\n", ok != n ? "not every stream completed"
                                      : "the thread count grew with the open streams");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::router::openai

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::router::openai::Run();
}
