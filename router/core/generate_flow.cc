#include "router/core/generate_flow.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"
#include "router/core/generate_flow_internal.h"
#include "router/core/router_metrics.h"
#include "router/core/routing_policy.h"
#include "router/core/validation.h"

namespace tandem::router {
namespace {

// How often a request waiting for a worker to come back (WaitForRoute) routes again.
constexpr absl::Duration kRouteWaitPoll = absl::Milliseconds(50);

// Codes that mean "the worker (or the connection to it) is gone", not "the request is bad".
// A server that dies mid-stream shows up as UNAVAILABLE (connection reset) or CANCELLED (the
// server cancelled its streams on shutdown); a crashed handler as UNKNOWN.
bool IsWorkerFault(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kCancelled ||
         code == absl::StatusCode::kUnknown || code == absl::StatusCode::kDeadlineExceeded;
}

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

}  // namespace

ModelLimits GenerateFlow::LimitsOf(const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
  return ModelLimits{std::min(a.vocab_size(), b.vocab_size()),
                     std::min(a.max_model_len(), b.max_model_len())};
}

void GenerateFlow::Route() {
  const auto& prompt = request_.prompt_token_ids();
  RoutingSnapshot snap =
      registry().Snapshot(absl::MakeConstSpan(prompt.data(), prompt.size()), request_.cache_salt());
  if (snap.registered == 0) {
    return Done(absl::UnavailableError("no workers are registered with the router"));
  }
  std::erase_if(snap.candidates,
                [&](const RouteCandidate& c) { return excluded_.contains(c.worker_id); });
  absl::StatusOr<RoutePlan> plan = ChooseRoute(snap.candidates);
  if (!plan.ok()) {
    if (snap.in_backoff > 0 && WaitForRoute()) return;
    return Done(plan.status());
  }
  if (RouterMetrics* metrics = orch_.options().metrics; metrics != nullptr) {
    if (plan->disaggregated()) {
      metrics->RecordRouting(plan->prefill_worker, v1::WORKER_ROLE_PREFILL);
      metrics->RecordRouting(plan->decode_worker, v1::WORKER_ROLE_DECODE);
    } else {
      metrics->RecordRouting(plan->mixed_worker, v1::WORKER_ROLE_MIXED);
    }
  }
  if (plan->disaggregated()) {
    StartDisaggregated(*plan, snap);
  } else {
    StartMixed(*plan, snap);
  }
}

bool GenerateFlow::WaitForRoute() {
  const std::optional<absl::Time> next =
      NextWaitPoll(&route_wait_until_, orch_.options().route_wait);
  if (!next.has_value()) return false;
  PostAt(shared_from_this(), *next, [](GenerateFlow& f) {
    if (f.EndIfInterrupted(/*abort_workers=*/false)) return;
    // A worker this request found dead may be back (re-registered, re-admitted after its
    // backoff, or its link up again): any route beats failing; attempt_ still bounds the calls.
    f.registry().ReadmitReconnected();
    f.excluded_.clear();
    f.Route();
  });
  return true;
}

std::optional<absl::Time> GenerateFlow::NextWaitPoll(absl::Time* until, absl::Duration budget) {
  const absl::Time now = absl::Now();
  if (*until == absl::InfinitePast()) *until = std::min(now + budget, now + (deadline_ - now) / 2);
  const absl::Time next = now + kRouteWaitPoll;
  if (next > *until) return std::nullopt;
  return next;
}

bool GenerateFlow::EndIfInterrupted(bool abort_workers) {
  absl::Status reason = flight_->cancel_reason();
  if (reason.ok() && client_ != nullptr && client_->Cancelled()) {
    reason = absl::CancelledError("the client cancelled the request");
  }
  if (reason.ok()) return false;
  if (abort_workers) AbortWorkers();
  EndPhase(std::move(reason), "");
  return true;
}

void GenerateFlow::StartMixed(const RoutePlan& plan, const RoutingSnapshot& snap) {
  absl::StatusOr<WorkerRef> ref = registry().BeginCall(plan.mixed_worker, &snap);
  if (!ref.ok()) return EndPhase(absl::UnavailableError(ref.status().message()), plan.mixed_worker);
  stream_slot_ = std::make_unique<WorkerSlot>(&registry(), *std::move(ref));
  const WorkerRef& w = stream_slot_->ref();
  if (absl::Status s = ValidateAgainstModel(request_, LimitsOf(w.info, w.info)); !s.ok()) {
    return EndPhase(s, "");
  }
  touched_.push_back(w);
  trace_.set_mixed_worker_id(w.info.worker_id());
  trace_.set_decode_sent_micros(Since());
  StartStream(w.client->NewGenerate(request_, NewCallOptions()), Phase::kMixed);
}

void GenerateFlow::StartStream(std::unique_ptr<StreamCall> stream, Phase phase) {
  phase_ = phase;
  relay_ = Relay();
  if (!flight_->AddCall(stream_slot_->id(), stream.get())) {
    AbortWorkers();
    return EndPhase(flight_->cancel_reason(), "");
  }
  stream_ = std::move(stream);
  // The callbacks hold the flow until the stream ends (OnStreamDone drops the call, and them).
  stream_->Start(
      [self = shared_from_this()](v1::GenerateResponse chunk) {
        Continue(self, [chunk = std::move(chunk)](GenerateFlow& f) mutable {
          f.OnStreamMessage(std::move(chunk));
        });
      },
      [self = shared_from_this()](absl::Status status) mutable {
        Continue(std::move(self), [status](GenerateFlow& f) { f.OnStreamDone(status); });
      });
}

void GenerateFlow::OnStreamMessage(v1::GenerateResponse chunk) {
  if (!relay_.got_any) registry().Answered(stream_slot_->ref());  // reachable, whatever it was
  relay_.got_any = true;
  // Nothing may follow the final message; after the client left, the stream only drains.
  if (relay_.finished || relay_.client_gone) return stream_->ReadNext();
  if (chunk.token_ids_size() > 0 && trace_.decode_first_micros() == 0) {
    trace_.set_decode_first_micros(Since());
  }
  v1::GenerateResponse out;
  *out.mutable_token_ids() = std::move(*chunk.mutable_token_ids());
  completion_tokens_ += out.token_ids_size();
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    relay_.finished = true;
    if (phase_ == Phase::kMixed) cached_tokens_ = chunk.usage().cached_prompt_tokens();
    *trace_.mutable_decode() = chunk.worker_times();
    out.set_finish_reason(chunk.finish_reason());
    *out.mutable_usage() = FinalUsage();
  }
  if ((out.token_ids_size() > 0 || relay_.finished) && !Send(out)) {
    relay_.client_gone = true;
    stream_->Cancel();
  }
  stream_->ReadNext();
}

void GenerateFlow::OnStreamDone(const absl::Status& status) {
  flight_->RemoveCall(stream_.get());
  stream_.reset();
  if (phase_ == Phase::kDecode) {
    OnDecodeEnded(status);
  } else {
    OnMixedEnded(status);
  }
}

void GenerateFlow::OnMixedEnded(const absl::Status& status) {
  if (relay_.finished) return EndPhase(absl::OkStatus(), "");
  AbortWorkers();
  if (relay_.client_gone) return EndPhase(absl::CancelledError("the client went away"), "");
  if (status.ok()) {
    return EndPhase(absl::InternalError(absl::StrCat("mixed worker ", stream_slot_->id(),
                                                     " ended its stream without a finish reason")),
                    "");
  }
  ClassifyFailure(stream_slot_.get(), status, "generate",
                  [](GenerateFlow& f, absl::Status s, bool retriable) {
                    std::string retry = retriable && !f.relay_.got_any ? f.stream_slot_->id() : "";
                    f.EndPhase(std::move(s), std::move(retry));
                  });
}

void GenerateFlow::EndPhase(absl::Status status, std::string retry_without) {
  // The phase's workers leave the request (a failed one is marked unhealthy now).
  prefill_slot_.reset();
  stream_slot_.reset();
  prefill_client_.reset();
  // Router.Abort wins over whatever the interrupted call reported.
  if (!status.ok() && flight_->cancel_reason().code() == absl::StatusCode::kAborted) {
    return Done(FinishAborted());
  }
  if (!retry_without.empty() && attempt_ < MaxAttempts()) {
    LOG(WARNING) << "request " << flight_->id() << ": retrying without worker " << retry_without
                 << " (" << status << ")";
    excluded_.insert(std::move(retry_without));
    ++attempt_;
    return Route();
  }
  Done(status);
}

absl::Status GenerateFlow::FinishAborted() {
  v1::GenerateResponse last;
  last.set_finish_reason(v1::FINISH_REASON_ABORTED);
  *last.mutable_usage() = FinalUsage();
  if (!Send(last)) return absl::CancelledError("the client went away");
  return absl::OkStatus();
}

void GenerateFlow::Done(const absl::Status& status) {
  const absl::Duration e2e = absl::Now() - start_;
  const OrchestratorOptions& options = orch_.options();
  if (options.log_trace_json) {
    if (trace_.end_micros() == 0) trace_.set_end_micros(Since());
    trace_.set_status(status.ok() ? "OK" : status.ToString());
    LogTraceJson(trace_);
  }
  if (options.metrics != nullptr) {
    options.metrics->RecordRequest(first_sent_ - start_, e2e, sent_tokens_,
                                   request_.prompt_token_ids_size(), status);
  }
  VLOG(1) << "request " << flight_->id() << ": " << request_.prompt_token_ids_size()
          << " prompt tokens, " << absl::FormatDuration(e2e) << ", " << status;
  prefill_slot_.reset();
  stream_slot_.reset();
  prefill_client_.reset();
  touched_.clear();
  admission_.reset();  // the id is free again before the client hears of the end
  std::shared_ptr<ResponseSink> sink = std::move(sink_);
  sink->Finish(status);
  sink.reset();
  Task on_end = std::move(on_end_);
  std::move(on_end)();
}

void GenerateFlow::ClassifyFailure(WorkerSlot* slot, absl::Status status, std::string phase,
                                   FailureNext next) {
  // Interrupted by the router (Router.Abort, lost worker, shutdown): that reason is the answer.
  if (absl::Status reason = flight_->cancel_reason(); !reason.ok()) {
    return std::move(next)(*this, reason, false);
  }
  const absl::StatusCode code = status.code();
  CheckClientCancelled(code, absl::Now() + absl::Milliseconds(200),
                       [slot, status = std::move(status), phase = std::move(phase),
                        next = std::move(next)](GenerateFlow& f, bool cancelled) mutable {
                         if (cancelled) {
                           return std::move(next)(
                               f, absl::CancelledError("the client cancelled the request"), false);
                         }
                         bool retriable = false;
                         absl::Status s = f.Failure(*slot, status, phase, &retriable);
                         std::move(next)(f, std::move(s), retriable);
                       });
}

absl::Status GenerateFlow::Failure(WorkerSlot& slot, const absl::Status& status,
                                   absl::string_view phase, bool* retriable) {
  *retriable = false;
  if (absl::Status reason = flight_->cancel_reason(); !reason.ok()) return reason;
  const std::string where = absl::StrCat(phase, " worker ", slot.id());
  const absl::StatusCode code = status.code();
  // grpc's and absl's clocks may differ by a little; the slack keeps a request timeout from
  // being blamed on the worker.
  if (code == absl::StatusCode::kDeadlineExceeded &&
      absl::Now() + absl::Milliseconds(100) >= deadline_) {
    return absl::DeadlineExceededError(
        absl::StrCat("request ", flight_->id(), " exceeded its deadline during ", where));
  }
  if (IsWorkerFault(code)) {
    const std::string msg = absl::StrCat(where, " failed: ", status.message());
    slot.MarkFailed(msg, /*link_down=*/!slot.ref().client->Connected());
    *retriable = true;
    return absl::UnavailableError(msg);
  }
  return absl::Status(code, absl::StrCat(where, ": ", status.message()));
}

void GenerateFlow::CheckClientCancelled(absl::StatusCode code, absl::Time until, ClientNext next) {
  if (client_ == nullptr) return std::move(next)(*this, false);
  if (client_->Cancelled()) return std::move(next)(*this, true);
  if (code != absl::StatusCode::kCancelled || absl::Now() >= until) {
    return std::move(next)(*this, false);
  }
  PostAt(shared_from_this(), absl::Now() + absl::Milliseconds(2),
         [code, until, next = std::move(next)](GenerateFlow& f) mutable {
           f.CheckClientCancelled(code, until, std::move(next));
         });
}

CallOptions GenerateFlow::NewCallOptions() const {
  // The caller makes a client cancel cancel the worker call at once (and carries the client's
  // own deadline, where it has one).
  CallOptions options;
  options.deadline = deadline_;
  options.caller = client_;
  return options;
}

bool GenerateFlow::Send(v1::GenerateResponse& chunk) {
  chunk.set_request_id(flight_->client_id());
  if (chunk.token_ids_size() > 0) {
    if (trace_.first_token_micros() == 0) trace_.set_first_token_micros(Since());
    // For RouterMetrics: time to the first token, gaps between chunks.
    const absl::Time now = absl::Now();
    if (sent_tokens_ == 0) {
      first_sent_ = now;
    } else if (orch_.options().metrics != nullptr) {
      orch_.options().metrics->RecordInterToken(now - last_sent_);
    }
    last_sent_ = now;
    sent_tokens_ += chunk.token_ids_size();
  }
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    trace_.set_end_micros(Since());
    trace_.set_finish_reason(chunk.finish_reason());
    trace_.set_prompt_tokens(chunk.usage().prompt_tokens());
    trace_.set_completion_tokens(chunk.usage().completion_tokens());
    trace_.set_status("OK");  // a final message: the stream ends OK
    if (request_.trace()) *chunk.mutable_trace() = trace_;
  }
  return sink_->Send(chunk);
}

uint64_t GenerateFlow::Since() const {
  return static_cast<uint64_t>(
      std::max<int64_t>(1, absl::ToInt64Microseconds(absl::Now() - start_)));
}

v1::Usage GenerateFlow::FinalUsage() const {
  v1::Usage usage;
  usage.set_prompt_tokens(static_cast<uint32_t>(request_.prompt_token_ids_size()));
  usage.set_completion_tokens(completion_tokens_);
  usage.set_cached_prompt_tokens(cached_tokens_);
  return usage;
}

void GenerateFlow::AbortWorkers() {
  absl::flat_hash_set<std::string> sent;
  for (const WorkerRef& w : touched_) {
    if (sent.insert(w.info.worker_id()).second) orch_.SendAbort(w, flight_->id());
  }
  touched_.clear();
}

void StartGenerateFlow(Orchestrator& orch, v1::GenerateRequest request, Admission admission,
                       const CallerContext* client, std::shared_ptr<ResponseSink> sink,
                       Task on_end) {
  std::make_shared<GenerateFlow>(orch, std::move(request), std::move(admission), client,
                                 std::move(sink), std::move(on_end))
      ->Begin();
}

}  // namespace tandem::router
