#include "router/orchestrator.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/validation.h"

namespace tandem::router {
namespace {

// One worker's part in a request: counted in the worker's load from BeginCall until destroyed;
// MarkFailed makes the registry mark the worker unhealthy at that point.
class WorkerSlot {
 public:
  WorkerSlot(WorkerRegistry* registry, WorkerRef ref) : registry_(registry), ref_(std::move(ref)) {}
  ~WorkerSlot() { registry_->EndCall(ref_, failed_, error_); }
  WorkerSlot(const WorkerSlot&) = delete;
  WorkerSlot& operator=(const WorkerSlot&) = delete;

  const WorkerRef& ref() const { return ref_; }
  const std::string& id() const { return ref_.info.worker_id(); }
  void MarkFailed(std::string error) {
    failed_ = true;
    error_ = std::move(error);
  }

 private:
  WorkerRegistry* registry_;
  WorkerRef ref_;
  bool failed_ = false;
  std::string error_;
};

// Codes that mean "the worker (or the connection to it) is gone", not "the request is bad".
// A server that dies mid-stream shows up as UNAVAILABLE (connection reset) or CANCELLED (the
// server cancelled its streams on shutdown); a crashed handler as UNKNOWN.
bool IsWorkerFault(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kCancelled ||
         code == absl::StatusCode::kUnknown || code == absl::StatusCode::kDeadlineExceeded;
}

ModelLimits LimitsOf(const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
  return ModelLimits{std::min(a.vocab_size(), b.vocab_size()),
                     std::min(a.max_model_len(), b.max_model_len())};
}

// A phase's result: the status for the client, or "retry this phase without that worker".
struct Outcome {
  absl::Status status;
  std::string retry_without;
};

struct RelayResult {
  bool finished = false;     // a message with finish_reason was relayed
  bool client_gone = false;  // a Send to the client failed
  bool got_any = false;      // the worker sent at least one message
  absl::Status status;       // the worker stream's final status
};

// One request's run through the orchestrator. Lives on the handler's stack.
class GenerateCall {
 public:
  GenerateCall(Orchestrator& orch, const v1::GenerateRequest& request, InFlightRequest& flight,
               const CallerContext* client, ResponseSink& sink, absl::Time start,
               v1::RequestTrace& trace)
      : orch_(orch),
        request_(request),
        flight_(flight),
        client_(client),
        sink_(sink),
        start_(start),
        trace_(trace) {
    deadline_ = absl::Now() + orch_.options().request_timeout;
    if (client_ != nullptr) deadline_ = std::min(deadline_, client_->deadline());
  }

  absl::Status Run();

 private:
  Outcome RunDisaggregated(const RoutePlan& plan, const RoutingSnapshot& snap);
  // `prefill_client`: the P that holds the KV lease (asked to rebind it when D is replaced).
  absl::Status RunDecode(const v1::WorkerInfo& prefill, WorkerClient& prefill_client,
                         std::unique_ptr<WorkerSlot> decode, const v1::PrefillResponse& prefilled);
  // The KV lease P holds for this request moves to `decode_worker` (P serves no other reader).
  // Best effort: if P does not answer, the new decode worker finds the source unreachable or the
  // lease not its own, and recomputes or fails as for any KV failure.
  void ReassignLease(WorkerClient& prefill_client, uint64_t lease_id,
                     const std::string& decode_worker);
  Outcome RunMixed(const RoutePlan& plan, const RoutingSnapshot& snap);

  RelayResult Relay(StreamCall& stream, bool usage_from_worker);
  // The client's status for a failed worker call; marks the worker failed for faults and sets
  // *retriable then.
  absl::Status Failure(WorkerSlot& slot, const absl::Status& status, absl::string_view phase,
                       bool* retriable);
  // Whether the client cancelled. A worker call cut by the client's cancel ends CANCELLED
  // possibly a moment before the server context reports it, so CANCELLED waits a little for it.
  bool ClientCancelled(absl::StatusCode code) const;
  CallOptions NewCallOptions() const;
  bool Send(v1::GenerateResponse& chunk);
  v1::Usage FinalUsage() const;
  absl::Status FinishAborted();
  void AbortWorkers();
  // Microseconds since the router took the request (never 0, so 0 stays "did not happen").
  uint64_t Since() const;

  Orchestrator& orch_;
  const v1::GenerateRequest& request_;
  InFlightRequest& flight_;
  const CallerContext* client_;
  ResponseSink& sink_;
  absl::Time deadline_;
  const absl::Time start_;
  v1::RequestTrace& trace_;
  uint32_t completion_tokens_ = 0;
  uint32_t cached_tokens_ = 0;
  std::vector<WorkerRef> touched_;  // workers that saw the request (Abort targets)
};

absl::Status GenerateCall::Run() {
  const int max_attempts = std::max(orch_.options().max_attempts, 1);
  absl::flat_hash_set<std::string> excluded;
  const auto& prompt = request_.prompt_token_ids();
  for (int attempt = 1;; ++attempt) {
    RoutingSnapshot snap = orch_.registry().Snapshot(
        absl::MakeConstSpan(prompt.data(), prompt.size()), request_.cache_salt());
    if (snap.registered == 0) {
      return absl::UnavailableError("no workers are registered with the router");
    }
    std::erase_if(snap.candidates,
                  [&](const RouteCandidate& c) { return excluded.contains(c.worker_id); });
    ASSIGN_OR_RETURN(RoutePlan plan, ChooseRoute(snap.candidates));
    if (RouterMetrics* metrics = orch_.options().metrics; metrics != nullptr) {
      if (plan.disaggregated()) {
        metrics->RecordRouting(plan.prefill_worker, v1::WORKER_ROLE_PREFILL);
        metrics->RecordRouting(plan.decode_worker, v1::WORKER_ROLE_DECODE);
      } else {
        metrics->RecordRouting(plan.mixed_worker, v1::WORKER_ROLE_MIXED);
      }
    }
    Outcome out = plan.disaggregated() ? RunDisaggregated(plan, snap) : RunMixed(plan, snap);
    // Router.Abort wins over whatever the interrupted call reported.
    if (!out.status.ok() && flight_.cancel_reason().code() == absl::StatusCode::kAborted) {
      return FinishAborted();
    }
    if (!out.retry_without.empty() && attempt < max_attempts) {
      LOG(WARNING) << "request " << flight_.id() << ": retrying without worker "
                   << out.retry_without << " (" << out.status << ")";
      excluded.insert(out.retry_without);
      continue;
    }
    return out.status;
  }
}

Outcome GenerateCall::RunDisaggregated(const RoutePlan& plan, const RoutingSnapshot& snap) {
  absl::StatusOr<WorkerRef> p_ref = orch_.registry().BeginCall(plan.prefill_worker, &snap);
  if (!p_ref.ok()) return {absl::UnavailableError(p_ref.status().message()), plan.prefill_worker};
  // P counts in its worker's load only while it prefills (reset below), D until the end.
  auto prefill = std::make_unique<WorkerSlot>(&orch_.registry(), *std::move(p_ref));
  absl::StatusOr<WorkerRef> d_ref = orch_.registry().BeginCall(plan.decode_worker);
  if (!d_ref.ok()) return {absl::UnavailableError(d_ref.status().message()), plan.decode_worker};
  auto decode = std::make_unique<WorkerSlot>(&orch_.registry(), *std::move(d_ref));
  if (absl::Status s =
          ValidateAgainstModel(request_, LimitsOf(prefill->ref().info, decode->ref().info));
      !s.ok()) {
    return {s, ""};
  }

  v1::PrefillRequest preq;
  *preq.mutable_request() = request_;
  preq.set_remote_decode(true);
  preq.set_lease_ms(orch_.options().lease_ms);
  // P binds the KV lease to this decode worker: only it may read, renew or release it.
  preq.set_decode_worker_id(decode->id());
  v1::PrefillResponse prefilled;
  touched_.push_back(prefill->ref());
  const v1::WorkerInfo prefill_info = prefill->ref().info;
  trace_.set_prefill_worker_id(prefill_info.worker_id());
  trace_.set_decode_worker_id(decode->id());
  std::unique_ptr<PrefillCall> call = prefill->ref().client->NewPrefill(NewCallOptions());
  if (!flight_.AddCall(prefill->id(), call.get())) {
    AbortWorkers();
    return {flight_.cancel_reason(), ""};
  }
  trace_.set_prefill_sent_micros(Since());
  absl::StatusOr<v1::PrefillResponse> answered = call->Run(preq);
  flight_.RemoveCall(call.get());
  trace_.set_prefill_done_micros(Since());
  if (!answered.ok()) {
    bool retriable = false;
    absl::Status s = Failure(*prefill, answered.status(), "prefill", &retriable);
    AbortWorkers();
    return {s, retriable ? prefill->id() : ""};
  }
  prefilled = *std::move(answered);
  const std::shared_ptr<WorkerClient> prefill_client = prefill->ref().client;
  prefill.reset();
  *trace_.mutable_prefill() = prefilled.worker_times();

  // The first token goes to the client now: TTFT does not wait for the KV transfer.
  cached_tokens_ = prefilled.usage().cached_prompt_tokens();
  completion_tokens_ = 1;
  v1::GenerateResponse first;
  first.add_token_ids(prefilled.first_token());
  const bool finished = prefilled.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  if (finished) {
    first.set_finish_reason(prefilled.finish_reason());
    *first.mutable_usage() = FinalUsage();
  }
  if (!Send(first)) {
    AbortWorkers();
    return {absl::CancelledError("the client went away"), ""};
  }
  if (finished) return {absl::OkStatus(), ""};
  if (!prefilled.has_kv_handle()) {
    AbortWorkers();
    return {absl::InternalError(absl::StrCat("prefill worker ", prefill_info.worker_id(),
                                             " returned neither a finish reason nor a kv_handle")),
            ""};
  }
  return {RunDecode(prefill_info, *prefill_client, std::move(decode), prefilled), ""};
}

absl::Status GenerateCall::RunDecode(const v1::WorkerInfo& prefill, WorkerClient& prefill_client,
                                     std::unique_ptr<WorkerSlot> decode,
                                     const v1::PrefillResponse& prefilled) {
  v1::DecodeRequest dreq;
  *dreq.mutable_request() = request_;
  dreq.set_first_token(prefilled.first_token());
  *dreq.mutable_kv_handle() = prefilled.kv_handle();
  dreq.set_on_kv_failure(orch_.options().on_kv_failure);
  absl::flat_hash_set<std::string> tried;
  for (int attempt = 1;; ++attempt) {
    touched_.push_back(decode->ref());
    trace_.set_decode_worker_id(decode->id());
    trace_.set_decode_attempts(static_cast<uint32_t>(attempt));
    trace_.set_decode_sent_micros(Since());
    trace_.clear_decode_first_micros();
    std::unique_ptr<StreamCall> stream = decode->ref().client->NewDecode(dreq, NewCallOptions());
    if (!flight_.AddCall(decode->id(), stream.get())) {
      AbortWorkers();
      return flight_.cancel_reason();
    }
    RelayResult r = Relay(*stream, /*usage_from_worker=*/false);
    flight_.RemoveCall(stream.get());
    if (r.finished) return absl::OkStatus();
    if (r.client_gone) {
      AbortWorkers();
      return absl::CancelledError("the client went away");
    }
    if (r.status.ok()) {
      AbortWorkers();
      return absl::InternalError(absl::StrCat("decode worker ", decode->id(),
                                              " ended its stream without a finish reason"));
    }
    bool retriable = false;
    absl::Status s = Failure(*decode, r.status, "decode", &retriable);
    // The KV is still leased on P: a decode worker that failed before producing anything can be
    // replaced by another one reading the same handle.
    if (retriable && !r.got_any && attempt < std::max(orch_.options().max_attempts, 1)) {
      tried.insert(decode->id());
      // A fresh view, not the one routing used: under load the prefill took seconds, and in a
      // rolling restart the decode worker that was away then may be back while this one drains.
      const RoutingSnapshot now = orch_.registry().Snapshot({}, request_.cache_salt());
      std::optional<std::string> next =
          ChooseDecode(now.candidates, prefill.model_id(), prefill.kv_layout_hash(), tried);
      if (next.has_value()) {
        absl::StatusOr<WorkerRef> ref = orch_.registry().BeginCall(*next);
        if (ref.ok()) {
          if (RouterMetrics* metrics = orch_.options().metrics; metrics != nullptr) {
            metrics->RecordRouting(*next, v1::WORKER_ROLE_DECODE);
          }
          LOG(WARNING) << "request " << flight_.id() << ": decode worker " << decode->id()
                       << " failed (" << s << "); retrying on " << *next;
          ReassignLease(prefill_client, prefilled.kv_handle().lease_id(), *next);
          decode = std::make_unique<WorkerSlot>(&orch_.registry(), *std::move(ref));
          continue;
        }
      }
    }
    AbortWorkers();
    return s;
  }
}

Outcome GenerateCall::RunMixed(const RoutePlan& plan, const RoutingSnapshot& snap) {
  absl::StatusOr<WorkerRef> ref = orch_.registry().BeginCall(plan.mixed_worker, &snap);
  if (!ref.ok()) return {absl::UnavailableError(ref.status().message()), plan.mixed_worker};
  WorkerSlot worker(&orch_.registry(), *std::move(ref));
  if (absl::Status s =
          ValidateAgainstModel(request_, LimitsOf(worker.ref().info, worker.ref().info));
      !s.ok()) {
    return {s, ""};
  }
  touched_.push_back(worker.ref());
  trace_.set_mixed_worker_id(worker.id());
  trace_.set_decode_sent_micros(Since());
  std::unique_ptr<StreamCall> stream = worker.ref().client->NewGenerate(request_, NewCallOptions());
  if (!flight_.AddCall(worker.id(), stream.get())) {
    AbortWorkers();
    return {flight_.cancel_reason(), ""};
  }
  RelayResult r = Relay(*stream, /*usage_from_worker=*/true);
  flight_.RemoveCall(stream.get());
  if (r.finished) return {absl::OkStatus(), ""};
  AbortWorkers();
  if (r.client_gone) return {absl::CancelledError("the client went away"), ""};
  if (r.status.ok()) {
    return {absl::InternalError(absl::StrCat("mixed worker ", worker.id(),
                                             " ended its stream without a finish reason")),
            ""};
  }
  bool retriable = false;
  absl::Status s = Failure(worker, r.status, "generate", &retriable);
  return {s, retriable && !r.got_any ? worker.id() : ""};
}

RelayResult GenerateCall::Relay(StreamCall& stream, bool usage_from_worker) {
  RelayResult r;
  v1::GenerateResponse chunk;
  while (stream.Read(&chunk)) {
    r.got_any = true;
    if (r.finished) continue;  // nothing may follow the final message
    if (chunk.token_ids_size() > 0 && trace_.decode_first_micros() == 0) {
      trace_.set_decode_first_micros(Since());
    }
    v1::GenerateResponse out;
    *out.mutable_token_ids() = chunk.token_ids();
    completion_tokens_ += chunk.token_ids_size();
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      r.finished = true;
      if (usage_from_worker) cached_tokens_ = chunk.usage().cached_prompt_tokens();
      *trace_.mutable_decode() = chunk.worker_times();
      out.set_finish_reason(chunk.finish_reason());
      *out.mutable_usage() = FinalUsage();
    }
    if (out.token_ids_size() == 0 && !r.finished) continue;
    if (!Send(out)) {
      r.client_gone = true;
      stream.Cancel();
      break;
    }
  }
  r.status = stream.Finish();
  return r;
}

absl::Status GenerateCall::Failure(WorkerSlot& slot, const absl::Status& status,
                                   absl::string_view phase, bool* retriable) {
  *retriable = false;
  // Interrupted by the router (Router.Abort, lost worker, shutdown): that reason is the answer.
  if (absl::Status reason = flight_.cancel_reason(); !reason.ok()) return reason;
  if (ClientCancelled(status.code())) {
    return absl::CancelledError("the client cancelled the request");
  }
  const std::string where = absl::StrCat(phase, " worker ", slot.id());
  const absl::StatusCode code = status.code();
  // grpc's and absl's clocks may differ by a little; the slack keeps a request timeout from
  // being blamed on the worker.
  if (code == absl::StatusCode::kDeadlineExceeded &&
      absl::Now() + absl::Milliseconds(100) >= deadline_) {
    return absl::DeadlineExceededError(
        absl::StrCat("request ", flight_.id(), " exceeded its deadline during ", where));
  }
  if (IsWorkerFault(code)) {
    const std::string msg = absl::StrCat(where, " failed: ", status.message());
    slot.MarkFailed(msg);
    *retriable = true;
    return absl::UnavailableError(msg);
  }
  return absl::Status(code, absl::StrCat(where, ": ", status.message()));
}

bool GenerateCall::ClientCancelled(absl::StatusCode code) const {
  if (client_ == nullptr) return false;
  if (client_->Cancelled()) return true;
  if (code != absl::StatusCode::kCancelled) return false;
  const absl::Time until = absl::Now() + absl::Milliseconds(200);
  while (absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
    if (client_->Cancelled()) return true;
  }
  return false;
}

CallOptions GenerateCall::NewCallOptions() const {
  // The caller makes a client cancel cancel the worker call at once (and carries the client's
  // own deadline, where it has one).
  CallOptions options;
  options.deadline = deadline_;
  options.caller = client_;
  return options;
}

bool GenerateCall::Send(v1::GenerateResponse& chunk) {
  chunk.set_request_id(flight_.client_id());
  if (chunk.token_ids_size() > 0 && trace_.first_token_micros() == 0) {
    trace_.set_first_token_micros(Since());
  }
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    trace_.set_end_micros(Since());
    trace_.set_finish_reason(chunk.finish_reason());
    trace_.set_prompt_tokens(chunk.usage().prompt_tokens());
    trace_.set_completion_tokens(chunk.usage().completion_tokens());
    trace_.set_status("OK");  // a final message: the stream ends OK
    if (request_.trace()) *chunk.mutable_trace() = trace_;
  }
  return sink_.Send(chunk);
}

uint64_t GenerateCall::Since() const {
  return static_cast<uint64_t>(
      std::max<int64_t>(1, absl::ToInt64Microseconds(absl::Now() - start_)));
}

v1::Usage GenerateCall::FinalUsage() const {
  v1::Usage usage;
  usage.set_prompt_tokens(static_cast<uint32_t>(request_.prompt_token_ids_size()));
  usage.set_completion_tokens(completion_tokens_);
  usage.set_cached_prompt_tokens(cached_tokens_);
  return usage;
}

absl::Status GenerateCall::FinishAborted() {
  v1::GenerateResponse last;
  last.set_finish_reason(v1::FINISH_REASON_ABORTED);
  *last.mutable_usage() = FinalUsage();
  if (!Send(last)) return absl::CancelledError("the client went away");
  return absl::OkStatus();
}

void GenerateCall::ReassignLease(WorkerClient& prefill_client, uint64_t lease_id,
                                 const std::string& decode_worker) {
  v1::ReassignLeaseRequest request;
  request.set_request_id(request_.request_id());
  request.set_lease_id(lease_id);
  request.set_decode_worker_id(decode_worker);
  const absl::Status s = prefill_client.ReassignLease(
      request, std::min(deadline_, absl::Now() + orch_.options().abort_timeout));
  if (!s.ok()) {
    LOG(WARNING) << "request " << flight_.id() << ": moving its KV lease to " << decode_worker
                 << ": " << s;
  }
}

void GenerateCall::AbortWorkers() {
  absl::flat_hash_set<std::string> sent;
  for (const WorkerRef& w : touched_) {
    if (sent.insert(w.info.worker_id()).second) orch_.SendAbort(w, flight_.id());
  }
  touched_.clear();
}

}  // namespace

Orchestrator::Orchestrator(WorkerRegistry* registry, OrchestratorOptions options)
    : registry_(registry),
      options_(std::move(options)),
      aborts_(std::make_shared<PendingAborts>()) {}

Orchestrator::~Orchestrator() {
  absl::MutexLock lock(&aborts_->mu);
  // Abort calls carry abort_timeout as their deadline, so this wait is bounded; callbacks that
  // come later still find their (shared) counter alive.
  auto done = [p = aborts_.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) { return p->count == 0; };
  aborts_->mu.AwaitWithTimeout(absl::Condition(&done), options_.abort_timeout + absl::Seconds(1));
}

namespace {

// One line, written with a single write(2) so concurrent requests' lines do not interleave.
void LogTraceJson(const v1::RequestTrace& trace) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(trace, &json, options).ok()) return;
  std::string line = absl::StrCat("{\"request_trace\":", json, "}\n");
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

// Times a request's stream for RouterMetrics: first token, gaps between chunks, tokens.
class TimingSink final : public ResponseSink {
 public:
  TimingSink(ResponseSink& inner, RouterMetrics* metrics, absl::Time start)
      : inner_(inner), metrics_(metrics), start_(start) {}
  bool Send(const v1::GenerateResponse& chunk) override {
    if (chunk.token_ids_size() > 0) {
      const absl::Time now = absl::Now();
      if (tokens_ == 0) {
        first_ = now;
      } else if (metrics_ != nullptr) {
        metrics_->RecordInterToken(now - last_);
      }
      last_ = now;
      tokens_ += chunk.token_ids_size();
    }
    return inner_.Send(chunk);
  }
  int64_t tokens() const { return tokens_; }
  absl::Duration ttft() const { return first_ - start_; }

 private:
  ResponseSink& inner_;
  RouterMetrics* const metrics_;
  const absl::Time start_;
  absl::Time first_, last_;
  int64_t tokens_ = 0;
};

}  // namespace

absl::Status Orchestrator::Generate(const v1::GenerateRequest& request, InFlightRequest& flight,
                                    const CallerContext* client, ResponseSink& sink) {
  const absl::Time start = absl::Now();
  TimingSink timed(sink, options_.metrics, start);
  v1::RequestTrace trace;
  trace.set_request_id(flight.id());
  trace.set_start_unix_micros(absl::ToUnixMicros(start));
  absl::Status s = GenerateCall(*this, request, flight, client, timed, start, trace).Run();
  const absl::Duration e2e = absl::Now() - start;
  if (options_.log_trace_json) {
    if (trace.end_micros() == 0) {
      trace.set_end_micros(
          static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Microseconds(e2e))));
    }
    trace.set_status(s.ok() ? "OK" : s.ToString());
    LogTraceJson(trace);
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRequest(timed.ttft(), e2e, timed.tokens(),
                                    request.prompt_token_ids_size(), s);
  }
  VLOG(1) << "request " << flight.id() << ": " << request.prompt_token_ids_size()
          << " prompt tokens, " << absl::FormatDuration(e2e) << ", " << s;
  return s;
}

void Orchestrator::SendAbort(const WorkerRef& worker, const std::string& request_id) {
  if (worker.client == nullptr) return;
  {
    absl::MutexLock lock(&aborts_->mu);
    ++aborts_->count;
  }
  worker.client->AbortAsync(
      request_id, options_.abort_timeout,
      [pending = aborts_, request_id, worker_id = worker.info.worker_id()](absl::Status s) {
        VLOG(1) << "Abort(" << request_id << ") on " << worker_id << ": " << s.code();
        absl::MutexLock lock(&pending->mu);
        --pending->count;
      });
}

}  // namespace tandem::router
