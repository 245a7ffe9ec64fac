// //router:tandem_router — the router daemon (router/README.md).
//
//   tandem_router [--listen=127.0.0.1:7000] [--port_file=PATH] [--internal_listen=HOST:PORT]
//                 [--internal_port_file=PATH] (--tls_cert --tls_key --tls_ca [--api_key_file]
//                 [--public_client_ca] | --insecure) [--heartbeat_interval_ms=1000]
//                 [--worker_timeout_ms=5000] [--max_queue=1024] [--request_timeout_ms=600000]
//                 [--grpc_max_connections=4096] [--grpc_handshake_timeout_ms=30000]
//                 [--grpc_max_concurrent_streams=8192] [--grpc_memory_quota_mb=4096]
//                 [--lease_ms=0] [--on_kv_failure=recompute] [--max_attempts=2]
//                 [--route_wait_ms=2000] [--decode_wait_ms=20000]
//                 [--prefix_index_max_blocks=1048576] [--shutdown_grace_ms=5000]
//
// Prints "router listening on HOST:PORT" once serving; SIGTERM/SIGINT drain and exit 0.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/grpc_listener_flags.h"
#include "common/http/http_server.h"
#include "common/http/metrics_server.h"
#include "common/logging.h"
#include "common/security/flags.h"
#include "router/grpc/router_server.h"
#include "router/openai/http_api.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7000",
          "host:port of the public Router service (port 0 = pick one)");
ABSL_FLAG(std::string, port_file, "", "write the bound host:port here once listening");
ABSL_FLAG(std::string, internal_listen, "",
          "host:port of the internal port: WorkerRegistry + admin ListWorkers, mTLS (required "
          "with TLS; empty with --insecure: served on --listen)");
ABSL_FLAG(std::string, internal_port_file, "", "write the internal port's host:port here");
ABSL_FLAG(std::string, public_client_ca, "",
          "PEM CA whose client certificates the public port requires (empty: none asked for)");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000, "heartbeat interval told to workers");
ABSL_FLAG(int64_t, worker_timeout_ms, 5000, "no heartbeat for this long -> worker unhealthy");
ABSL_FLAG(int32_t, max_queue, 1024, "requests in flight at most; more -> RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, request_timeout_ms, 600000, "deadline of one request, end to end");
ABSL_FLAG(int64_t, lease_ms, 0, "KV lease asked of prefill workers (0 = worker default)");
ABSL_FLAG(std::string, on_kv_failure, "recompute",
          "what a decode worker does when it cannot load the KV: recompute or fail");
ABSL_FLAG(int32_t, max_attempts, 2,
          "workers tried per phase when one is unreachable before producing output");
ABSL_FLAG(int64_t, route_wait_ms, 2000,
          "with no route while a worker is in its short failure backoff, how long a request waits "
          "for it (also at most half of the time left to its deadline; 0 = refuse at once)");
ABSL_FLAG(int64_t, decode_wait_ms, 20000,
          "how long a request whose decode worker's connection dropped before it decoded waits "
          "for that connection to be back or for another decode worker (also at most half of "
          "the time left to its deadline; keep it below the prefill workers' KV lease; 0 = fail "
          "at once)");
ABSL_FLAG(int64_t, prefix_index_max_blocks, int64_t{1} << 20,
          "block hashes remembered per worker for prefix-aware routing");
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000, "on SIGTERM, time in-flight requests get to finish");
ABSL_FLAG(int32_t, verbosity, 0, "log verbosity (VLOG level)");
ABSL_FLAG(std::string, log_format, "text",
          "text | json: json also writes one {\"request_trace\":{...}} line per finished request "
          "to stderr (request id, workers, phase times in microseconds, KV bytes, status)");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT of the OpenAI-compatible HTTP API: HTTPS with --tls_cert/--tls_key (and "
          "--public_client_ca), plain HTTP with --insecure (port 0 = any free port; empty: off)");
ABSL_FLAG(std::string, model, "",
          "with --http_listen: model directory for the tokenizer, chat template and config.json "
          "(no weights are read)");
ABSL_FLAG(std::string, served_model_name, "", "the API's model name (default: --model's name)");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT of GET /metrics (Prometheus: latencies, outcomes, workers) and /health");
ABSL_FLAG(std::string, http_port_file, "", "write the HTTP API's bound host:port here");
ABSL_FLAG(int32_t, http_max_running, 1024,
          "HTTP requests generating at once (no thread each; also bounded by --max_queue)");
ABSL_FLAG(int32_t, http_max_pending, 1024, "HTTP requests waiting behind them; more -> 429");
ABSL_FLAG(int32_t, orchestrator_threads, 2,
          "threads running every request's steps (fixed: requests in flight add none)");
ABSL_FLAG(int32_t, http_max_n, 4, "largest 'n' (choices per request) the HTTP API accepts");
ABSL_FLAG(int64_t, http_max_body_bytes, 8 << 20,
          "largest HTTP request body; larger -> 413 before the body is read");
ABSL_FLAG(int64_t, http_max_buffered_body_bytes, 64 << 20,
          "HTTP request bodies all connections may hold at once; past it -> 503 before reading");

namespace tandem::router {
namespace {

absl::StatusOr<RouterOptions> OptionsFromFlags() {
  RouterOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.internal_listen = absl::GetFlag(FLAGS_internal_listen);
  absl::StatusOr<security::SecurityConfig> sec = security::DaemonSecurityFromFlags("tandem_router");
  if (!sec.ok()) return sec.status();
  o.security = *std::move(sec);
  if (!absl::GetFlag(FLAGS_public_client_ca).empty()) {
    absl::StatusOr<std::string> ca =
        security::ReadPemFile(absl::GetFlag(FLAGS_public_client_ca), "--public_client_ca");
    if (!ca.ok()) return ca.status();
    o.public_client_ca_pem = *std::move(ca);
  }
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  absl::StatusOr<GrpcListenerOptions> ports = GrpcListenerOptionsFromFlags();
  if (!ports.ok()) return ports.status();
  o.grpc_ports = *ports;
  o.registry.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  o.registry.worker_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms));
  const int64_t index_blocks = absl::GetFlag(FLAGS_prefix_index_max_blocks);
  if (index_blocks < 1) return absl::InvalidArgumentError("--prefix_index_max_blocks must be >= 1");
  o.registry.prefix_index_max_blocks = static_cast<size_t>(index_blocks);
  o.orchestrator.request_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_request_timeout_ms));
  const int64_t lease_ms = absl::GetFlag(FLAGS_lease_ms);
  if (lease_ms < 0 || lease_ms > UINT32_MAX) {
    return absl::InvalidArgumentError("--lease_ms must be in [0, 2^32)");
  }
  o.orchestrator.lease_ms = static_cast<uint32_t>(lease_ms);
  const std::string policy = absl::GetFlag(FLAGS_on_kv_failure);
  if (policy == "recompute") {
    o.orchestrator.on_kv_failure = v1::KV_LOAD_FAILURE_POLICY_RECOMPUTE;
  } else if (policy == "fail") {
    o.orchestrator.on_kv_failure = v1::KV_LOAD_FAILURE_POLICY_FAIL;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_kv_failure must be recompute or fail, got '", policy, "'"));
  }
  o.orchestrator.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (o.orchestrator.max_attempts < 1) {
    return absl::InvalidArgumentError("--max_attempts must be >= 1");
  }
  if (absl::GetFlag(FLAGS_route_wait_ms) < 0) {
    return absl::InvalidArgumentError("--route_wait_ms must be >= 0");
  }
  o.orchestrator.route_wait = absl::Milliseconds(absl::GetFlag(FLAGS_route_wait_ms));
  if (absl::GetFlag(FLAGS_decode_wait_ms) < 0) {
    return absl::InvalidArgumentError("--decode_wait_ms must be >= 0");
  }
  o.orchestrator.decode_wait = absl::Milliseconds(absl::GetFlag(FLAGS_decode_wait_ms));
  const std::string log_format = absl::GetFlag(FLAGS_log_format);
  if (log_format != "text" && log_format != "json") {
    return absl::InvalidArgumentError("--log_format must be text or json");
  }
  o.orchestrator.log_trace_json = log_format == "json";
  o.orchestrator.threads = absl::GetFlag(FLAGS_orchestrator_threads);
  if (o.orchestrator.threads < 1) {
    return absl::InvalidArgumentError("--orchestrator_threads must be >= 1");
  }
  return o;
}

// The OpenAI-compatible HTTP API when --http_listen is set (null otherwise).
// HTTPS with the public port's certificate (and its client CA) unless --insecure.
absl::StatusOr<std::unique_ptr<openai::HttpApi>> StartHttpApi(RouterServer& router,
                                                              const RouterOptions& router_options) {
  const security::SecurityConfig& security = router_options.security;
  const std::string listen = absl::GetFlag(FLAGS_http_listen);
  if (listen.empty()) return std::unique_ptr<openai::HttpApi>();
  absl::StatusOr<std::pair<std::string, int>> address = http::ParseHostPort(listen, "http_listen");
  if (!address.ok()) return address.status();
  if (absl::GetFlag(FLAGS_model).empty()) {
    return absl::InvalidArgumentError("--http_listen needs --model=DIR (tokenizer files)");
  }
  absl::StatusOr<std::unique_ptr<openai::ServedModel>> model =
      openai::ServedModel::Load(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_served_model_name));
  if (!model.ok()) return model.status();
  openai::HttpApiOptions options;
  options.address = address->first;
  options.port = address->second;
  options.max_running = absl::GetFlag(FLAGS_http_max_running);
  options.max_pending = absl::GetFlag(FLAGS_http_max_pending);
  options.limits.max_n = absl::GetFlag(FLAGS_http_max_n);
  options.api_keys = security.api_keys;
  const int64_t max_body = absl::GetFlag(FLAGS_http_max_body_bytes);
  const int64_t max_buffered = absl::GetFlag(FLAGS_http_max_buffered_body_bytes);
  if (max_body < 1 || max_buffered < max_body) {
    return absl::InvalidArgumentError(
        "--http_max_body_bytes must be >= 1 and --http_max_buffered_body_bytes >= it");
  }
  options.max_body_bytes = static_cast<uint64_t>(max_body);
  options.max_buffered_body_bytes = static_cast<uint64_t>(max_buffered);
  if (!security.insecure) {
    options.tls = http::ServerTlsOptions{security.tls.cert_pem, security.tls.key_pem,
                                         router_options.public_client_ca_pem};
  }
  if (options.max_running < 1 || options.max_pending < 0 || options.limits.max_n < 1) {
    return absl::InvalidArgumentError("--http_max_running and --http_max_n must be >= 1");
  }
  return openai::HttpApi::Start(options, *std::move(model), &router.registry(), &router.requests(),
                                &router.orchestrator());
}

// GET /metrics and /health on --metrics_listen (null without it).
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartMetrics(RouterServer& router) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return std::unique_ptr<http::HttpServer>();
  return http::StartMetricsServer(
      listen, "metrics_listen", [&router] { return router.MetricsText(); },
      [] { return std::pair<int, std::string>(200, "ok\n"); });
}

absl::Status Run() {
  LoggingOptions logging;
  logging.verbosity = absl::GetFlag(FLAGS_verbosity);
  if (absl::Status s = ApplyLoggingOptions(logging); !s.ok()) return s;
  absl::StatusOr<RouterOptions> options = OptionsFromFlags();
  if (!options.ok()) return options.status();

  // Taken synchronously here; blocked in every thread started after this (gRPC's included).
  TerminationSignals signals;
  // Request bodies freed go back to the system (the RSS falls when clients are done).
  ReturnLargeFreedBlocksToTheSystem();
  // Every client connection is a descriptor; the shell's default soft limit is easy to flood.
  LOG(INFO) << "open file limit: " << RaiseOpenFileLimit();
  // A client or worker gone mid-write is an error on that call, never the router's end.
  IgnoreBrokenPipes();

  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(*options);
  if (!router.ok()) return router.status();
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*router)->address()); !s.ok()) return s;
  }
  std::printf("router listening on %s\n", (*router)->address().c_str());
  std::printf("internal: %s\n", (*router)->internal_address().c_str());
  const std::string internal_port_file = absl::GetFlag(FLAGS_internal_port_file);
  if (!internal_port_file.empty()) {
    absl::Status s = WritePortFile(internal_port_file, (*router)->internal_address());
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<http::HttpServer>> metrics = StartMetrics(**router);
  if (!metrics.ok()) return metrics.status();
  if (*metrics != nullptr) std::printf("metrics on port %d\n", (*metrics)->port());
  absl::StatusOr<std::unique_ptr<openai::HttpApi>> http = StartHttpApi(**router, *options);
  if (!http.ok()) return http.status();
  if (*http != nullptr) {
    const std::string listen = absl::GetFlag(FLAGS_http_listen);
    const std::string http_address =
        absl::StrCat(listen.substr(0, listen.rfind(':')), ":", (*http)->port());
    std::printf("http: %s://%s (model '%s')\n", options->security.insecure ? "http" : "https",
                http_address.c_str(), (*http)->model().name.c_str());
    const std::string http_port_file = absl::GetFlag(FLAGS_http_port_file);
    if (!http_port_file.empty()) {
      if (absl::Status s = WritePortFile(http_port_file, http_address); !s.ok()) return s;
    }
  }
  std::fflush(stdout);

  const int sig = signals.Wait();
  LOG(INFO) << "signal " << sig << ": shutting down";
  metrics->reset();
  http->reset();  // open HTTP streams end (their requests are aborted on the workers)
  (*router)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  std::printf("router stopped\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tandem_router --listen=127.0.0.1:PORT [--port_file=PATH] [--max_queue=N] ...");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = tandem::InitLogging(argv[0]); !s.ok()) {
    std::fprintf(stderr, "tandem_router: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::Status s = tandem::router::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tandem_router: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
