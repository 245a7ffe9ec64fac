// //tests/bench:tandem_bench — load generator against a tandem_router.
//
//   tandem_bench --router=HOST:PORT [--num_requests=200] [--rate=inf | R1,R2,...] [--warmup=0]
//                [--max_concurrency=0]
//                [--prompt_len=128 | LO:HI] [--output_len=64 | LO:HI] [--seed=0]
//                [--slo_ttft_ms=0] [--slo_tpot_ms=0] [--temperature=0] [--ignore_eos=true]
//                [--timeout_ms=600000] [--json] [--stop_file=PATH] [--requests_out=PATH]
//                [--tls_ca=PEM [--api_key=KEY | $TANDEM_API_KEY]]
//
// Plain text by default; with --tls_ca the router's public port over TLS, every call carrying
// the API key (a client key is enough), as deploy/local/up.sh prints them.
// Requests arrive as a Poisson process at --rate requests/s ("inf": all at once), at most
// --max_concurrency in flight (0 = unlimited). Prompts are random token ids below the smallest
// vocabulary of the router's healthy workers (Router.Health); lengths are fixed or uniform. Output
// lengths are exact with --ignore_eos (the default). Every request is a gRPC callback-API stream,
// so no thread is held per request and timestamps are taken as messages arrive.
//
// Reports, like vLLM's benchmark_serving: successes/failures, duration, request and token
// throughput, goodput (requests/s meeting every SLO given: TTFT <= --slo_ttft_ms and
// TPOT <= --slo_tpot_ms), and mean/p50/p90/p99 of TTFT, TPOT (per request: time after the first
// token / (output tokens - 1)), ITL (gaps between streamed messages) and end-to-end latency.
// --json prints the same as one JSON line per load level ("rate" names the level). A comma
// list of rates runs the levels in order; --warmup requests go first, one at a time, and are
// not reported. Exit status 1 when any request failed.
//
// --stop_file: a level stops sending new requests once PATH exists (checked at least every
// 100 ms) and reports the ones it sent, so a driver can hold a steady load for as long as
// something else (a rolling restart) takes. --requests_out: appends one JSON line per request
// (level, send time in Unix ms, ok, TTFT, e2e, tokens, every ITL gap, the error), for a driver
// that splits one run into phases.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/security/flags.h"
#include "common/security/grpc_security.h"
#include "common/status_macros.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tests/bench/stats.h"

ABSL_FLAG(std::string, router, "127.0.0.1:7000", "router address");
ABSL_FLAG(int32_t, num_requests, 200, "requests to send");
ABSL_FLAG(std::string, rate, "inf",
          "Poisson arrival rate in requests/s, or inf; a comma list runs one level after the "
          "other (e.g. 1,4,inf), each with --num_requests requests");
ABSL_FLAG(int32_t, warmup, 0, "requests sent one at a time before measuring (not reported)");
ABSL_FLAG(int32_t, max_concurrency, 0, "requests in flight at most (0 = unlimited)");
ABSL_FLAG(std::string, prompt_len, "128", "prompt tokens: N or LO:HI (uniform)");
ABSL_FLAG(std::string, output_len, "64", "output tokens (max_tokens): N or LO:HI (uniform)");
ABSL_FLAG(uint64_t, seed, 0, "random seed (0 = a fresh one, printed)");
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput SLO on time to first token (0 = none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput SLO on time per output token (0 = none)");
ABSL_FLAG(double, temperature, 0, "sampling temperature");
ABSL_FLAG(bool, ignore_eos, true, "generate exactly max_tokens");
ABSL_FLAG(int64_t, timeout_ms, 600000, "deadline of each request");
ABSL_FLAG(bool, json, false, "print one JSON line instead of the table");
ABSL_FLAG(std::string, stop_file, "",
          "stop sending new requests once this file exists (the level reports those sent)");
ABSL_FLAG(std::string, requests_out, "", "append one JSON line per request to this file");
ABSL_FLAG(std::string, api_key, "", "API key for the router (default: $TANDEM_API_KEY)");

namespace tandem::bench {
namespace {

// What one request saw.
struct Record {
  absl::Time sent, first_token, last_token, done;
  int input_tokens = 0;
  int output_tokens = 0;
  std::vector<double> itl_ms;
  grpc::Status status;
  bool finished = false;
};

// Counts requests in flight and done; the dispatcher waits on it for a free slot.
class Tracker {
 public:
  explicit Tracker(int max_in_flight) : max_in_flight_(max_in_flight) {}
  void Acquire() {
    absl::MutexLock lock(&mu_);
    auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return max_in_flight_ <= 0 || in_flight_ < max_in_flight_;
    };
    mu_.Await(absl::Condition(&has_room));
    ++in_flight_;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    ++done_;
  }
  void WaitAllDone(int n) {
    absl::MutexLock lock(&mu_);
    auto all = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n; };
    mu_.Await(absl::Condition(&all));
  }

 private:
  const int max_in_flight_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

// One Generate stream on gRPC's callback API. Its Record is written only by gRPC's callbacks
// (serialized per call) and read after Tracker says it is done.
class Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(v1::GenerateRequest request, Tracker* tracker)
      : request_(std::move(request)), tracker_(tracker) {
    record_.input_tokens = request_.prompt_token_ids_size();
  }
  void Start(v1::Router::Stub* stub, absl::Duration timeout) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    record_.sent = absl::Now();
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const absl::Time now = absl::Now();
    if (chunk_.token_ids_size() > 0) {
      if (record_.output_tokens == 0) {
        record_.first_token = now;
      } else {
        record_.itl_ms.push_back(absl::ToDoubleMilliseconds(now - record_.last_token));
      }
      record_.last_token = now;
      record_.output_tokens += chunk_.token_ids_size();
    }
    record_.finished |= chunk_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& status) override {
    record_.done = absl::Now();
    record_.status = status;
    tracker_->Release();
  }
  const Record& record() const { return record_; }

 private:
  v1::GenerateRequest request_;
  Tracker* tracker_;
  grpc::ClientContext ctx_;
  v1::GenerateResponse chunk_;
  Record record_;
};

struct ModelFacts {
  uint32_t vocab_size = 0;
  uint32_t max_model_len = 0;
};

// The vocabulary and length limits from Router.Health, which any client key may call (the
// admin-only ListWorkers would also show the workers' addresses and epochs).
absl::StatusOr<ModelFacts> QueryModel(v1::Router::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::HealthResponse resp;
  grpc::Status s = stub.Health(&ctx, v1::HealthRequest(), &resp);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("Health: ", s.error_message()));
  if (resp.vocab_size() == 0 || resp.max_model_len() == 0) {
    return absl::UnavailableError(
        absl::StrCat("the router has no healthy serving workers: ", resp.detail()));
  }
  return ModelFacts{resp.vocab_size(), resp.max_model_len()};
}

std::string Line(absl::string_view name, double value, int precision = 2) {
  return absl::StrFormat("%-42s %.*f\n", name, precision, value);
}

std::string SummaryBlock(absl::string_view title, absl::string_view abbrev, const Summary& s) {
  std::string out = absl::StrFormat("%s\n", title);
  absl::StrAppend(&out, Line(absl::StrCat("Mean ", abbrev, " (ms):"), s.mean),
                  Line(absl::StrCat("P50 ", abbrev, " (ms):"), s.p50),
                  Line(absl::StrCat("P90 ", abbrev, " (ms):"), s.p90),
                  Line(absl::StrCat("P99 ", abbrev, " (ms):"), s.p99));
  return out;
}

std::string SummaryJson(const Summary& s) {
  return absl::StrFormat("{\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f}",
                         s.mean, s.p50, s.p90, s.p99, s.max);
}

// One load level's outcome.
struct LevelResult {
  std::string rate;  // as given
  int requests = 0;
  int ok = 0;
  int good = 0;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  Summary ttft, tpot, itl, e2e;
  std::map<std::string, int> errors;
};

// The run's fixed parts: where to send, what to send.
struct Workload {
  v1::Router::Stub* stub = nullptr;
  ModelFacts model;
  LengthRange prompt_len, output_len;
  uint64_t seed = 0;
  absl::Duration timeout;
  int max_concurrency = 0;
};

// The `i`-th request of a level; prompts and lengths are drawn from `rng` in send order, one
// request at a time (a --stop_file run may ask for millions and send a few hundred).
std::unique_ptr<Call> MakeCall(const Workload& w, int i, absl::string_view tag, Tracker* tracker,
                               std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> token(0, w.model.vocab_size - 1);
  v1::GenerateRequest req;
  req.set_request_id(absl::StrFormat("bench-%016x-%s-%d", w.seed, tag, i));
  const uint32_t len = w.prompt_len.Sample(rng);
  for (uint32_t t = 0; t < len; ++t) req.add_prompt_token_ids(token(rng));
  req.mutable_sampling()->set_max_tokens(w.output_len.Sample(rng));
  req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  req.mutable_sampling()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  return std::make_unique<Call>(std::move(req), tracker);
}

LevelResult Aggregate(const std::vector<std::unique_ptr<Call>>& calls, double duration_s) {
  LevelResult out;
  out.requests = static_cast<int>(calls.size());
  out.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms);
  const double slo_tpot = absl::GetFlag(FLAGS_slo_tpot_ms);
  for (const auto& c : calls) {
    const Record& r = c->record();
    if (!r.status.ok() || !r.finished || r.output_tokens == 0) {
      ++out.errors[r.status.ok()
                       ? std::string("stream ended without a finish reason")
                       : absl::StrCat(r.status.error_code(), ": ", r.status.error_message())];
      continue;
    }
    ++out.ok;
    out.input_tokens += r.input_tokens;
    out.output_tokens += r.output_tokens;
    const double t_first = absl::ToDoubleMilliseconds(r.first_token - r.sent);
    ttft.push_back(t_first);
    e2e.push_back(absl::ToDoubleMilliseconds(r.done - r.sent));
    double t_per = 0;
    if (r.output_tokens > 1) {
      t_per = absl::ToDoubleMilliseconds(r.last_token - r.first_token) / (r.output_tokens - 1);
      tpot.push_back(t_per);
    }
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    if ((slo_ttft <= 0 || t_first <= slo_ttft) && (slo_tpot <= 0 || t_per <= slo_tpot)) {
      ++out.good;
    }
  }
  out.ttft = Summarize(ttft);
  out.tpot = Summarize(tpot);
  out.itl = Summarize(itl);
  out.e2e = Summarize(e2e);
  return out;
}

bool StopRequested(const std::string& stop_file) {
  std::error_code ignored;
  return !stop_file.empty() && std::filesystem::exists(stop_file, ignored);
}

// Sleeps until `until`, in slices short enough to notice the stop file; false: stop.
bool SleepUnlessStopped(absl::Time until, const std::string& stop_file) {
  if (stop_file.empty()) {
    absl::SleepFor(until - absl::Now());
    return true;
  }
  while (true) {
    if (StopRequested(stop_file)) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(100)));
  }
}

std::string JsonEscaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  return out;
}

void AppendRequestLines(const std::vector<std::unique_ptr<Call>>& calls, const std::string& level,
                        const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    std::fprintf(stderr, "tandem_bench: cannot open --requests_out=%s\n", path.c_str());
    return;
  }
  for (const auto& c : calls) {
    const Record& r = c->record();
    const bool ok = r.status.ok() && r.finished && r.output_tokens > 0;
    std::string itl;
    for (double gap : r.itl_ms)
      absl::StrAppend(&itl, itl.empty() ? "" : ",", absl::StrFormat("%.3f", gap));
    std::fprintf(
        f,
        "{\"level\":\"%s\",\"sent_unix_ms\":%.3f,\"ok\":%s,\"ttft_ms\":%.3f,"
        "\"e2e_ms\":%.3f,\"output_tokens\":%d,\"itl_ms\":[%s],\"error\":\"%s\"}\n",
        level.c_str(), absl::ToDoubleMilliseconds(r.sent - absl::UnixEpoch()),
        ok ? "true" : "false",
        r.output_tokens > 0 ? absl::ToDoubleMilliseconds(r.first_token - r.sent) : -1.0,
        absl::ToDoubleMilliseconds(r.done - r.sent), r.output_tokens, itl.c_str(),
        ok ? ""
           : JsonEscaped(absl::StrCat(r.status.error_code(), ": ", r.status.error_message()))
                 .c_str());
  }
  std::fclose(f);
}

// Sends `n` requests arriving at `rate` (Poisson), or fewer when --stop_file appears, and waits
// for all of them.
LevelResult RunLevel(const Workload& w, int n, const std::string& rate_text, double rate,
                     absl::string_view tag, std::mt19937_64& rng) {
  Tracker tracker(w.max_concurrency);
  const std::vector<double> arrivals = PoissonArrivals(n, rate, rng);
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  std::vector<std::unique_ptr<Call>> calls;
  const absl::Time start = absl::Now();
  int sent = 0;
  for (; sent < n; ++sent) {
    std::unique_ptr<Call> call = MakeCall(w, sent, tag, &tracker, rng);  // before its send time
    if (!SleepUnlessStopped(start + absl::Seconds(arrivals[sent]), stop_file)) break;
    tracker.Acquire();
    call->Start(w.stub, w.timeout);
    calls.push_back(std::move(call));  // the Call stays where it is: callbacks may run already
  }
  tracker.WaitAllDone(sent);
  if (!absl::GetFlag(FLAGS_requests_out).empty() && tag != "warmup") {
    AppendRequestLines(calls, rate_text, absl::GetFlag(FLAGS_requests_out));
  }
  absl::Time end = start;
  for (const auto& c : calls) end = std::max(end, c->record().done);
  LevelResult result = Aggregate(calls, std::max(absl::ToDoubleSeconds(end - start), 1e-9));
  result.rate = rate_text;
  return result;
}

void PrintJson(const LevelResult& r, uint64_t seed) {
  const double d = r.duration_s;
  std::printf(
      "{\"rate\":\"%s\",\"seed\":%llu,\"successful_requests\":%d,\"failed_requests\":%d,"
      "\"duration_s\":%.3f,\"total_input_tokens\":%lld,\"total_output_tokens\":%lld,"
      "\"request_throughput\":%.3f,\"output_token_throughput\":%.3f,"
      "\"total_token_throughput\":%.3f,\"goodput\":%.3f,\"ttft_ms\":%s,\"tpot_ms\":%s,"
      "\"itl_ms\":%s,\"e2e_ms\":%s}\n",
      r.rate.c_str(), static_cast<unsigned long long>(seed), r.ok, r.requests - r.ok, d,
      static_cast<long long>(r.input_tokens), static_cast<long long>(r.output_tokens), r.ok / d,
      r.output_tokens / d, (r.input_tokens + r.output_tokens) / d, r.good / d,
      SummaryJson(r.ttft).c_str(), SummaryJson(r.tpot).c_str(), SummaryJson(r.itl).c_str(),
      SummaryJson(r.e2e).c_str());
}

void PrintTable(const LevelResult& r, uint64_t seed) {
  const double d = r.duration_s;
  std::string out = "============ Serving Benchmark Result ============\n";
  absl::StrAppend(
      &out, absl::StrFormat("%-42s %s\n", "Router:", absl::GetFlag(FLAGS_router)),
      absl::StrFormat("%-42s %s req/s, max concurrency %d, seed %d\n", "Load:", r.rate,
                      absl::GetFlag(FLAGS_max_concurrency), seed),
      absl::StrFormat("%-42s %d\n", "Successful requests:", r.ok),
      absl::StrFormat("%-42s %d\n", "Failed requests:", r.requests - r.ok),
      Line("Benchmark duration (s):", d),
      absl::StrFormat("%-42s %d\n", "Total input tokens:", r.input_tokens),
      absl::StrFormat("%-42s %d\n", "Total generated tokens:", r.output_tokens),
      Line("Request throughput (req/s):", r.ok / d),
      Line("Output token throughput (tok/s):", r.output_tokens / d),
      Line("Total token throughput (tok/s):", (r.input_tokens + r.output_tokens) / d),
      Line(absl::StrFormat("Goodput (req/s) [TTFT<=%gms, TPOT<=%gms]:",
                           absl::GetFlag(FLAGS_slo_ttft_ms), absl::GetFlag(FLAGS_slo_tpot_ms)),
           r.good / d),
      SummaryBlock("---------------Time to First Token----------------", "TTFT", r.ttft),
      SummaryBlock("-----Time per Output Token (excl. 1st token)------", "TPOT", r.tpot),
      SummaryBlock("---------------Inter-token Latency----------------", "ITL", r.itl),
      SummaryBlock("----------------End-to-end Latency----------------", "E2EL", r.e2e),
      "==================================================\n");
  std::fputs(out.c_str(), stdout);
}

// Plain text unless --tls_ca is given (the existing scripts pass neither it nor --insecure).
absl::StatusOr<std::shared_ptr<grpc::Channel>> RouterChannel() {
  const std::string router = absl::GetFlag(FLAGS_router);
  if (absl::GetFlag(FLAGS_tls_ca).empty()) {
    return grpc::CreateChannel(router, grpc::InsecureChannelCredentials());
  }
  ASSIGN_OR_RETURN(security::SecurityConfig config,
                   security::LoadSecurityConfig(security::SecurityOptionsFromFlags(
                       /*require_cert=*/false, /*require_ca=*/true)));
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (const char* env = std::getenv("TANDEM_API_KEY"); key.empty() && env != nullptr) key = env;
  return security::CreateChannelWithApiKey(router, config, key);
}

absl::Status Run() {
  const int n = absl::GetFlag(FLAGS_num_requests);
  if (n < 1) return absl::InvalidArgumentError("--num_requests must be >= 1");
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  std::vector<std::pair<std::string, double>> levels;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_rate), ',')) {
    absl::StatusOr<double> rate = ParseRate(text);
    if (!rate.ok()) return rate.status();
    levels.emplace_back(std::string(text), *rate);
  }
  Workload w;
  ASSIGN_OR_RETURN(w.prompt_len, ParseLengthRange("prompt_len", absl::GetFlag(FLAGS_prompt_len)));
  ASSIGN_OR_RETURN(w.output_len, ParseLengthRange("output_len", absl::GetFlag(FLAGS_output_len)));
  w.seed = absl::GetFlag(FLAGS_seed);
  if (w.seed == 0) w.seed = (uint64_t{std::random_device()()} << 32) | std::random_device()();
  std::mt19937_64 rng(w.seed);
  w.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  w.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, RouterChannel());
  auto stub = v1::Router::NewStub(channel);
  w.stub = stub.get();
  ASSIGN_OR_RETURN(w.model, QueryModel(*stub));
  if (uint64_t{w.prompt_len.hi} + w.output_len.hi > w.model.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (up to ", w.prompt_len.hi, ") + output (up to ", w.output_len.hi,
                     ") tokens exceed the workers' max_model_len ", w.model.max_model_len));
  }
  if (warmup > 0) {
    // Not measured: first-use costs (connections, CUDA graphs, allocator growth) land here.
    Workload one_at_a_time = w;
    one_at_a_time.max_concurrency = 1;
    const LevelResult r = RunLevel(one_at_a_time, warmup, "inf",
                                   std::numeric_limits<double>::infinity(), "warmup", rng);
    if (r.ok != r.requests) {
      return absl::UnavailableError(
          absl::StrCat(r.requests - r.ok, " of ", r.requests, " warmup requests failed"));
    }
  }
  int failed = 0, total = 0;
  for (size_t i = 0; i < levels.size(); ++i) {
    const LevelResult r =
        RunLevel(w, n, levels[i].first, levels[i].second, absl::StrCat("l", i), rng);
    absl::GetFlag(FLAGS_json) ? PrintJson(r, w.seed) : PrintTable(r, w.seed);
    for (const auto& [what, count] : r.errors) {
      std::fprintf(stderr, "tandem_bench: rate %s: %d failed: %s\n", r.rate.c_str(), count,
                   what.c_str());
    }
    std::fflush(stdout);
    failed += r.requests - r.ok;
    total += r.requests;
  }
  if (failed > 0) {
    return absl::UnavailableError(absl::StrCat(failed, " of ", total, " requests failed"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tandem_bench --router=HOST:PORT --num_requests=N --rate=R|inf --prompt_len=LO:HI "
      "--output_len=LO:HI [--max_concurrency=C] [--slo_ttft_ms=T --slo_tpot_ms=T]");
  absl::ParseCommandLine(argc, argv);
  absl::Status s = tandem::bench::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tandem_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
