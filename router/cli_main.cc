// //router:tandem_cli — talk to a tandem_router.
//
//   tandem_cli generate --router=ADDR --prompt_ids=1,2,3 --max_tokens=N [--temperature=0]
//              [--top_p=0] [--top_k=0] [--seed=S] [--stop_token_ids=5,6] [--ignore_eos]
//              [--request_id=ID] [--cache_salt=S] [--timeout_ms=600000] [--json] [--trace]
//   tandem_cli generate --http=[https://]HOST:PORT --prompt=TEXT [--model=NAME] [--max_tokens=N]
//   tandem_cli chat     --http=[https://]HOST:PORT --prompt=TEXT [--model=NAME] [--max_tokens=N]
//              text in, text out through the router's OpenAI-compatible HTTP API (router/openai/);
//              prints the text as it streams (HTTPS with --tls_ca, plain HTTP with --insecure)
//   tandem_cli workers --router=ADDR [--json]
//   tandem_cli health  --router=ADDR
//   tandem_cli abort   --router=ADDR --request_id=ID
//   tandem_cli stats   --worker=ADDR [--json]   one worker's WorkerStats (KV bytes received,
//                      load failures, leases, prefix-cache hits, ...), asked of the worker itself
//
// generate prints each token id as it arrives (space separated, flushed), then a newline, and a
// summary on stderr; with --json it prints one line instead:
//   {"request_id":"...","tokens":[...],"finish_reason":"length","ttft_ms":1.2,"itl_ms_p50":0.3,
//    "usage":{"prompt_tokens":3,"completion_tokens":8,"cached_prompt_tokens":0}}
// Security: --tls_ca=PEM (the cluster CA; TLS) with --api_key=KEY (or $TANDEM_API_KEY) for the
// public port: a client key serves generate, health and abort; `workers` there needs an admin
// (operator) key (make_certs.sh's admin_api_key). Or --tls_cert/--tls_key of an admin
// certificate for `workers --router=INTERNAL` (the router's internal port) and
// `stats --worker=ADDR`; --insecure for plain text.
// Exit status: 0 on success; 1 with the gRPC status on stderr on any error; `health` exits 2
// when the router answers but is not SERVING (so scripts can wait for readiness).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/http/tls.h"
#include "common/security/flags.h"
#include "common/security/grpc_security.h"
#include "google/protobuf/util/json_util.h"
#include "router/cli/cli_text.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:7000", "router address host:port");
ABSL_FLAG(std::string, worker, "", "stats: the worker's address host:port");
ABSL_FLAG(std::string, prompt_ids, "", "prompt token ids, comma separated");
ABSL_FLAG(int64_t, max_tokens, 16, "tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(double, top_p, 0.0, "0 = off");
ABSL_FLAG(int64_t, top_k, 0, "0 = off");
ABSL_FLAG(int64_t, seed, -1, "sampling seed; -1 = the worker picks one");
ABSL_FLAG(std::string, stop_token_ids, "", "stop token ids, comma separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past eos");
ABSL_FLAG(std::string, request_id, "", "request id (generate: empty = router assigns)");
ABSL_FLAG(std::string, cache_salt, "", "prefix-cache isolation salt");
ABSL_FLAG(int64_t, timeout_ms, 600000, "client deadline");
ABSL_FLAG(bool, json, false, "print one JSON line");
ABSL_FLAG(bool, trace, false,
          "generate: ask the router for the request's trace (phase times, workers, KV bytes); "
          "--json adds it as \"trace\", else it goes to stderr");
ABSL_FLAG(std::string, http, "",
          "generate --prompt / chat: the router's HTTP API, HOST:PORT or https://HOST:PORT (HTTPS "
          "with --tls_ca; plain HTTP with --insecure)");
ABSL_FLAG(std::string, prompt, "", "generate / chat: the prompt as text (needs --http)");
ABSL_FLAG(std::string, model, "", "generate --prompt / chat: model name (default: the served one)");
ABSL_FLAG(std::string, api_key, "",
          "API key for the router's public port (default: $TANDEM_API_KEY)");

namespace tandem::router {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::vector<uint32_t>> ParseIds(absl::string_view flag, const std::string& text) {
  std::vector<uint32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

// "FINISH_REASON_STOP_TOKEN" -> "stop_token".
std::string EnumSuffix(const std::string& name, absl::string_view prefix) {
  absl::string_view view = name;
  if (view.substr(0, prefix.size()) == prefix) view.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(view);
}

std::string FinishName(v1::FinishReason reason) {
  return EnumSuffix(v1::FinishReason_Name(reason), "FINISH_REASON_");
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string ApiKey() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (key.empty()) {
    const char* env = std::getenv("TANDEM_API_KEY");
    if (env != nullptr) key = env;
  }
  return key;
}

// `security`: loaded once in main from --tls_* / --insecure, passed to every command.
std::unique_ptr<v1::Router::Stub> Connect(const security::SecurityConfig& security) {
  return v1::Router::NewStub(security::CreateChannel(absl::GetFlag(FLAGS_router), security));
}

// Deadline and API key of every call.
void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  security::AttachApiKey(&ctx, ApiKey());
}

absl::StatusOr<v1::GenerateRequest> BuildRequest() {
  v1::GenerateRequest req;
  auto prompt = ParseIds("prompt_ids", absl::GetFlag(FLAGS_prompt_ids));
  if (!prompt.ok()) return prompt.status();
  if (prompt->empty()) return absl::InvalidArgumentError("--prompt_ids is required");
  for (uint32_t t : *prompt) req.add_prompt_token_ids(t);
  auto stops = ParseIds("stop_token_ids", absl::GetFlag(FLAGS_stop_token_ids));
  if (!stops.ok()) return stops.status();
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const int64_t top_k = absl::GetFlag(FLAGS_top_k);
  if (max_tokens < 0 || max_tokens > UINT32_MAX || top_k < 0 || top_k > UINT32_MAX) {
    return absl::InvalidArgumentError("--max_tokens and --top_k must be in [0, 2^32)");
  }
  req.set_request_id(absl::GetFlag(FLAGS_request_id));
  req.set_cache_salt(absl::GetFlag(FLAGS_cache_salt));
  v1::SamplingParams* sp = req.mutable_sampling();
  sp->set_max_tokens(static_cast<uint32_t>(max_tokens));
  sp->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sp->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  sp->set_top_k(static_cast<uint32_t>(top_k));
  if (absl::GetFlag(FLAGS_seed) >= 0)
    sp->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  for (uint32_t t : *stops) sp->add_stop_token_ids(t);
  sp->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  req.set_trace(absl::GetFlag(FLAGS_trace));
  return req;
}

// What a Generate stream brought: the tokens, their timing and the final chunk's details.
struct GenerateResult {
  std::string request_id;
  std::vector<uint32_t> tokens;
  double ttft_ms = -1;
  std::vector<double> itl_ms;  // between token chunks
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
  v1::RequestTrace trace;
  bool has_trace = false;
};

// Reads the stream to its end; without --json prints each token id as it arrives.
GenerateResult ReadGenerateStream(grpc::ClientReader<v1::GenerateResponse>& reader,
                                  Clock::time_point start, bool json) {
  GenerateResult result;
  v1::GenerateResponse chunk;
  Clock::time_point last = start;
  while (reader.Read(&chunk)) {
    const Clock::time_point now = Clock::now();
    if (result.request_id.empty()) result.request_id = chunk.request_id();
    if (chunk.token_ids_size() > 0) {
      const double ms = std::chrono::duration<double, std::milli>(now - last).count();
      if (result.ttft_ms < 0) {
        result.ttft_ms = std::chrono::duration<double, std::milli>(now - start).count();
      } else {
        result.itl_ms.push_back(ms);
      }
      last = now;
    }
    for (uint32_t t : chunk.token_ids()) {
      result.tokens.push_back(t);
      if (!json) std::printf("%s%u", result.tokens.size() == 1 ? "" : " ", t);
    }
    if (!json) std::fflush(stdout);
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish = chunk.finish_reason();
      result.usage = chunk.usage();
      if (chunk.has_trace()) {
        result.trace = chunk.trace();
        result.has_trace = true;
      }
    }
  }
  return result;
}

// The median inter-token latency (0 without any); reorders `itl_ms`.
double MedianItlMs(std::vector<double>& itl_ms) {
  if (itl_ms.empty()) return 0;
  std::nth_element(itl_ms.begin(), itl_ms.begin() + itl_ms.size() / 2, itl_ms.end());
  return itl_ms[itl_ms.size() / 2];
}

absl::StatusOr<std::string> TraceJson(const v1::RequestTrace& trace) {
  std::string trace_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(trace, &trace_json, options); !s.ok()) {
    return absl::InternalError(std::string(s.message()));
  }
  return trace_json;
}

// One JSON line on stdout (--json), else the summary on stderr.
void PrintGenerateSummary(const GenerateResult& r, double itl_p50, const std::string& trace_json,
                          bool json) {
  if (json) {
    std::printf(
        "{\"request_id\":%s,\"tokens\":[%s],\"finish_reason\":\"%s\",\"ttft_ms\":%.3f,"
        "\"itl_ms_p50\":%.3f,\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,"
        "\"cached_prompt_tokens\":%u}%s%s}\n",
        JsonString(r.request_id).c_str(), absl::StrJoin(r.tokens, ",").c_str(),
        FinishName(r.finish).c_str(), std::max(r.ttft_ms, 0.0), itl_p50, r.usage.prompt_tokens(),
        r.usage.completion_tokens(), r.usage.cached_prompt_tokens(),
        r.has_trace ? ",\"trace\":" : "", trace_json.c_str());
  } else {
    std::fprintf(stderr,
                 "request_id=%s finish_reason=%s prompt_tokens=%u completion_tokens=%u "
                 "cached_prompt_tokens=%u ttft_ms=%.3f itl_ms_p50=%.3f\n",
                 r.request_id.c_str(), FinishName(r.finish).c_str(), r.usage.prompt_tokens(),
                 r.usage.completion_tokens(), r.usage.cached_prompt_tokens(),
                 std::max(r.ttft_ms, 0.0), itl_p50);
    if (r.has_trace) std::fprintf(stderr, "trace=%s\n", trace_json.c_str());
  }
}

absl::Status Generate(const security::SecurityConfig& security) {
  absl::StatusOr<v1::GenerateRequest> req = BuildRequest();
  if (!req.ok()) return req.status();
  const bool json = absl::GetFlag(FLAGS_json);
  auto stub = Connect(security);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  const Clock::time_point start = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, *req);
  GenerateResult result = ReadGenerateStream(*reader, start, json);
  grpc::Status status = reader->Finish();
  if (!json && !result.tokens.empty()) std::printf("\n");
  // The summary and errors go to stderr, which is not buffered: end the token line first, or
  // with both streams on one pipe (a log, `2>&1 | tee`) the summary lands on the token line.
  std::fflush(stdout);
  if (!status.ok()) return FromGrpcStatus(status);
  const double itl_p50 = MedianItlMs(result.itl_ms);
  std::string trace_json;
  if (result.has_trace) {
    absl::StatusOr<std::string> printed = TraceJson(result.trace);
    if (!printed.ok()) return printed.status();
    trace_json = *std::move(printed);
  }
  PrintGenerateSummary(result, itl_p50, trace_json, json);
  std::fflush(stdout);
  return absl::OkStatus();
}

std::string RoleName(v1::WorkerRole role) {
  return EnumSuffix(v1::WorkerRole_Name(role), "WORKER_ROLE_");
}

std::string StatusName(v1::ServingStatus status) {
  return EnumSuffix(v1::ServingStatus_Name(status), "SERVING_STATUS_");
}

absl::Status Workers(const security::SecurityConfig& security) {
  auto stub = Connect(security);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListWorkersResponse resp;
  if (grpc::Status s = stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp); !s.ok()) {
    return FromGrpcStatus(s);
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("%-20s %-8s %-22s %-8s %-11s %-14s %7s %7s %9s %s\n", "WORKER", "ROLE", "ADDRESS",
                "HEALTHY", "STATUS", "GROUP", "RUNNING", "WAITING", "FREE_BLKS", "MODEL");
  }
  std::vector<std::string> rows;
  for (const v1::WorkerEntry& w : resp.workers()) {
    // The rank group: "1" or "tp=2 nccl [0,1]".
    const v1::WorkerGroup& g = w.info().group();
    const std::string group =
        g.size() <= 1
            ? "1"
            : absl::StrCat("tp=", g.size(), " ", g.backend(),
                           g.devices().empty()
                               ? ""
                               : absl::StrCat(" [", absl::StrJoin(g.devices(), ","), "]"));
    if (json) {
      rows.push_back(absl::StrFormat(
          "{\"worker_id\":%s,\"role\":\"%s\",\"address\":%s,\"healthy\":%s,\"status\":\"%s\","
          "\"epoch\":%u,\"model_id\":%s,\"num_running\":%u,\"num_waiting\":%u,"
          "\"kv_blocks_free\":%u,\"kv_blocks_total\":%u,\"last_heartbeat_unix_ms\":%d,"
          "\"tp_size\":%u,\"tp_backend\":%s,\"devices\":[%s]}",
          JsonString(w.info().worker_id()), RoleName(w.info().role()),
          JsonString(w.info().address()), w.healthy() ? "true" : "false", StatusName(w.status()),
          w.info().epoch(), JsonString(w.info().model_id()), w.load().num_running(),
          w.load().num_waiting(), w.load().kv_blocks_free(), w.load().kv_blocks_total(),
          w.last_heartbeat_unix_ms(), std::max<uint32_t>(g.size(), 1), JsonString(g.backend()),
          absl::StrJoin(g.devices(), ",")));
    } else {
      std::printf("%-20s %-8s %-22s %-8s %-11s %-14s %7u %7u %9u %s\n",
                  w.info().worker_id().c_str(), RoleName(w.info().role()).c_str(),
                  w.info().address().c_str(), w.healthy() ? "yes" : "no",
                  StatusName(w.status()).c_str(), group.c_str(), w.load().num_running(),
                  w.load().num_waiting(), w.load().kv_blocks_free(), w.info().model_id().c_str());
    }
  }
  if (json) std::printf("{\"workers\":[%s]}\n", absl::StrJoin(rows, ",").c_str());
  return absl::OkStatus();
}

// Returns the exit code.
absl::StatusOr<int> Health(const security::SecurityConfig& security) {
  auto stub = Connect(security);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::HealthResponse resp;
  if (grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &resp); !s.ok()) {
    return FromGrpcStatus(s);
  }
  std::printf("%s: %s\n", StatusName(resp.status()).c_str(), resp.detail().c_str());
  return resp.status() == v1::SERVING_STATUS_SERVING ? 0 : 2;
}

absl::Status Abort(const security::SecurityConfig& security) {
  const std::string id = absl::GetFlag(FLAGS_request_id);
  if (id.empty()) return absl::InvalidArgumentError("--request_id is required");
  auto stub = Connect(security);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::AbortRequest req;
  req.set_request_id(id);
  v1::AbortResponse resp;
  if (grpc::Status s = stub->Abort(&ctx, req, &resp); !s.ok()) return FromGrpcStatus(s);
  std::printf("%s\n", resp.found() ? "aborted" : "not in flight");
  return absl::OkStatus();
}

absl::Status WorkerStats(const security::SecurityConfig& security) {
  const std::string address = absl::GetFlag(FLAGS_worker);
  if (address.empty()) return absl::InvalidArgumentError("--worker is required");
  auto stub = v1::WorkerService::NewStub(security::CreateChannel(address, security));
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::WorkerStats stats;
  if (grpc::Status s = stub->Stats(&ctx, v1::WorkerStatsRequest(), &stats); !s.ok()) {
    return FromGrpcStatus(s);
  }
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%s", stats.DebugString().c_str());
    return absl::OkStatus();
  }
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(stats, &json, options); !s.ok()) {
    return absl::InternalError(absl::StrCat("stats to JSON: ", s.ToString()));
  }
  std::printf("%s\n", json.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tandem_cli generate|workers|health|abort --router=HOST:PORT [--prompt_ids=1,2,3 "
      "--max_tokens=N --json ...] | tandem_cli stats --worker=HOST:PORT [--json]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr,
                 "usage: tandem_cli generate|workers|health|abort --router=HOST:PORT ... | "
                 "stats --worker=HOST:PORT\n");
    return 1;
  }
  const std::string command = args[1];
  absl::Status s;
  int code = 0;
  const bool text =
      command == "chat" || (command == "generate" && !absl::GetFlag(FLAGS_prompt).empty());
  // The CA is enough for the public ports (gRPC and HTTPS); an admin certificate for internal
  // calls (and for a public port that asks for client certificates).
  absl::StatusOr<tandem::security::SecurityConfig> security =
      tandem::security::LoadSecurityConfig(tandem::security::SecurityOptionsFromFlags(
          /*require_cert=*/false, /*require_ca=*/true));
  if (!security.ok()) {
    std::fprintf(stderr, "tandem_cli: %s\n", security.status().ToString().c_str());
    return 1;
  }
  if (text) {
    tandem::router::TextRequest text;
    text.http_address = absl::GetFlag(FLAGS_http);
    text.model = absl::GetFlag(FLAGS_model);
    text.prompt = absl::GetFlag(FLAGS_prompt);
    text.chat = command == "chat";
    text.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    text.temperature = absl::GetFlag(FLAGS_temperature);
    text.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
    text.api_key = tandem::router::ApiKey();
    if (const tandem::security::SecurityConfig& sec = *security; !sec.insecure) {
      text.tls = tandem::http::ClientTlsOptions{sec.tls.ca_pem, sec.server_name_override,
                                                sec.tls.cert_pem, sec.tls.key_pem};
    }
    if (text.http_address.empty() || text.prompt.empty()) {
      s = absl::InvalidArgumentError("text generation needs --http=HOST:PORT and --prompt");
    } else {
      s = tandem::router::StreamText(text);
    }
  } else if (command == "generate") {
    s = tandem::router::Generate(*security);
  } else if (command == "workers") {
    s = tandem::router::Workers(*security);
  } else if (command == "health") {
    absl::StatusOr<int> rc = tandem::router::Health(*security);
    s = rc.status();
    if (rc.ok()) code = *rc;
  } else if (command == "abort") {
    s = tandem::router::Abort(*security);
  } else if (command == "stats") {
    s = tandem::router::WorkerStats(*security);
  } else {
    s = absl::InvalidArgumentError(absl::StrCat(
        "unknown command '", command, "'; use generate, chat, workers, health, abort or stats"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "tandem_cli %s: %s\n", command.c_str(), s.ToString().c_str());
    return 1;
  }
  return code;
}
