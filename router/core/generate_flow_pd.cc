#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "router/core/generate_flow_internal.h"
#include "router/core/router_metrics.h"
#include "router/core/routing_policy.h"
#include "router/core/validation.h"

namespace tandem::router {

void GenerateFlow::StartDisaggregated(const RoutePlan& plan, const RoutingSnapshot& snap) {
  absl::StatusOr<WorkerRef> p_ref = registry().BeginCall(plan.prefill_worker, &snap);
  if (!p_ref.ok()) {
    return EndPhase(absl::UnavailableError(p_ref.status().message()), plan.prefill_worker);
  }
  // P counts in its worker's load only while it prefills, D until the end.
  prefill_slot_ = std::make_unique<WorkerSlot>(&registry(), *std::move(p_ref));
  absl::StatusOr<WorkerRef> d_ref = registry().BeginCall(plan.decode_worker);
  if (!d_ref.ok()) {
    return EndPhase(absl::UnavailableError(d_ref.status().message()), plan.decode_worker);
  }
  stream_slot_ = std::make_unique<WorkerSlot>(&registry(), *std::move(d_ref));
  const WorkerRef& p = prefill_slot_->ref();
  if (absl::Status s = ValidateAgainstModel(request_, LimitsOf(p.info, stream_slot_->ref().info));
      !s.ok()) {
    return EndPhase(s, "");
  }
  v1::PrefillRequest preq;
  *preq.mutable_request() = request_;
  preq.set_remote_decode(true);
  preq.set_lease_ms(orch_.options().lease_ms);
  // P binds the KV lease to this decode worker: only it may read, renew or release it.
  preq.set_decode_worker_id(stream_slot_->id());
  touched_.push_back(p);
  prefill_info_ = p.info;
  trace_.set_prefill_worker_id(prefill_info_.worker_id());
  trace_.set_decode_worker_id(stream_slot_->id());
  prefill_call_ = p.client->NewPrefill(NewCallOptions());
  if (!flight_->AddCall(prefill_slot_->id(), prefill_call_.get())) {
    prefill_call_.reset();
    AbortWorkers();
    return EndPhase(flight_->cancel_reason(), "");
  }
  trace_.set_prefill_sent_micros(Since());
  prefill_call_->Start(
      preq, [self = shared_from_this()](absl::StatusOr<v1::PrefillResponse> answered) mutable {
        Continue(std::move(self), [answered = std::move(answered)](GenerateFlow& f) mutable {
          f.OnPrefilled(std::move(answered));
        });
      });
}

void GenerateFlow::OnPrefilled(absl::StatusOr<v1::PrefillResponse> answered) {
  flight_->RemoveCall(prefill_call_.get());
  prefill_call_.reset();
  trace_.set_prefill_done_micros(Since());
  if (!answered.ok()) {
    return ClassifyFailure(prefill_slot_.get(), answered.status(), "prefill",
                           [](GenerateFlow& f, absl::Status s, bool retriable) {
                             f.AbortWorkers();
                             std::string retry = retriable ? f.prefill_slot_->id() : "";
                             f.EndPhase(std::move(s), std::move(retry));
                           });
  }
  const v1::PrefillResponse& prefilled = *answered;
  registry().Answered(prefill_slot_->ref());
  prefill_client_ = prefill_slot_->ref().client;
  prefill_slot_.reset();
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
    return EndPhase(absl::CancelledError("the client went away"), "");
  }
  if (finished) return EndPhase(absl::OkStatus(), "");
  if (!prefilled.has_kv_handle()) {
    AbortWorkers();
    return EndPhase(
        absl::InternalError(absl::StrCat("prefill worker ", prefill_info_.worker_id(),
                                         " returned neither a finish reason nor a kv_handle")),
        "");
  }
  *decode_request_.mutable_request() = request_;
  decode_request_.set_first_token(prefilled.first_token());
  *decode_request_.mutable_kv_handle() = prefilled.kv_handle();
  // P's MTP state of the prompt, for D's MTP drafter (worker.proto MtpHandoff).
  if (prefilled.has_mtp_handoff()) *decode_request_.mutable_mtp_handoff() = prefilled.mtp_handoff();
  decode_request_.set_on_kv_failure(orch_.options().on_kv_failure);
  decode_attempt_ = 1;
  StartDecode();
}

void GenerateFlow::StartDecode() {
  touched_.push_back(stream_slot_->ref());
  trace_.set_decode_worker_id(stream_slot_->id());
  trace_.set_decode_attempts(static_cast<uint32_t>(decode_attempt_));
  trace_.set_decode_sent_micros(Since());
  trace_.clear_decode_first_micros();
  StartStream(stream_slot_->ref().client->NewDecode(decode_request_, NewCallOptions()),
              Phase::kDecode);
}

bool GenerateFlow::ReplaceDecode(const absl::Status& failure) {
  decode_tried_.insert(stream_slot_->id());
  // A fresh view, not the one routing used: under load the prefill took seconds, and in a
  // rolling restart the decode worker that was away then may be back while this one drains.
  const RoutingSnapshot now = registry().Snapshot({}, request_.cache_salt());
  std::optional<std::string> next = ChooseDecode(now.candidates, prefill_info_.model_id(),
                                                 prefill_info_.kv_layout_hash(), decode_tried_);
  if (!next.has_value()) return false;
  absl::StatusOr<WorkerRef> ref = registry().BeginCall(*next);
  if (!ref.ok()) return false;
  if (RouterMetrics* metrics = orch_.options().metrics; metrics != nullptr) {
    metrics->RecordRouting(*next, v1::WORKER_ROLE_DECODE);
  }
  LOG(WARNING) << "request " << flight_->id() << ": decode worker " << stream_slot_->id()
               << " failed (" << failure << "); retrying on " << *next;
  stream_slot_ = std::make_unique<WorkerSlot>(&registry(), *std::move(ref));  // ends the old
  ++decode_attempt_;
  v1::ReassignLeaseRequest reassign;
  reassign.set_request_id(request_.request_id());
  reassign.set_lease_id(decode_request_.kv_handle().lease_id());
  reassign.set_decode_worker_id(*next);
  prefill_client_->ReassignLeaseAsync(
      reassign, std::min(deadline_, absl::Now() + orch_.options().abort_timeout),
      [self = shared_from_this(), worker = *next](absl::Status s) {
        Continue(self, [worker, s](GenerateFlow& f) {
          if (!s.ok()) {
            LOG(WARNING) << "request " << f.flight_->id() << ": moving its KV lease to " << worker
                         << ": " << s;
          }
          f.StartDecode();
        });
      });
  return true;
}

bool GenerateFlow::WaitForDecode(const absl::Status& failure) {
  const std::optional<absl::Time> next =
      NextWaitPoll(&decode_wait_until_, orch_.options().decode_wait);
  if (!next.has_value()) return false;
  PostAt(shared_from_this(), *next, [failure](GenerateFlow& f) {
    if (f.EndIfInterrupted(/*abort_workers=*/true)) return;
    if (f.ReplaceDecode(failure)) return;
    if (f.stream_slot_->ref().client->Connected()) return f.RetryDecode(failure);
    if (f.WaitForDecode(failure)) return;
    f.AbortWorkers();
    f.EndPhase(failure, "");
  });
  return true;
}

void GenerateFlow::RetryDecode(const absl::Status& failure) {
  const std::string id = stream_slot_->id();
  // The failed call ends first (its failure recorded), so that this one's answer re-admits D.
  stream_slot_.reset();
  absl::StatusOr<WorkerRef> ref = registry().BeginCall(id);
  if (!ref.ok()) {  // forgotten meanwhile
    AbortWorkers();
    return EndPhase(failure, "");
  }
  if (RouterMetrics* metrics = orch_.options().metrics; metrics != nullptr) {
    metrics->RecordRouting(id, v1::WORKER_ROLE_DECODE);
  }
  LOG(WARNING) << "request " << flight_->id() << ": decode worker " << id << " failed (" << failure
               << ") and is connected again; retrying there";
  // The KV lease stays bound to this worker id: nothing to move.
  stream_slot_ = std::make_unique<WorkerSlot>(&registry(), *std::move(ref));
  ++decode_attempt_;
  StartDecode();
}

void GenerateFlow::OnDecodeEnded(const absl::Status& status) {
  if (relay_.finished) return EndPhase(absl::OkStatus(), "");
  if (relay_.client_gone) {
    AbortWorkers();
    return EndPhase(absl::CancelledError("the client went away"), "");
  }
  if (status.ok()) {
    AbortWorkers();
    return EndPhase(absl::InternalError(absl::StrCat("decode worker ", stream_slot_->id(),
                                                     " ended its stream without a finish reason")),
                    "");
  }
  ClassifyFailure(stream_slot_.get(), status, "decode",
                  [](GenerateFlow& f, absl::Status s, bool retriable) {
                    // The KV is still leased on P: a decode worker that failed before producing
                    // anything can be replaced by another one reading the same handle.
                    // With none free and D's link down (gRPC reconnecting), it waits a little
                    // for one, D itself included.
                    if (retriable && !f.relay_.got_any && f.decode_attempt_ < f.MaxAttempts() &&
                        (f.ReplaceDecode(s) ||
                         (!f.stream_slot_->ref().client->Connected() && f.WaitForDecode(s)))) {
                      return;
                    }
                    f.AbortWorkers();
                    f.EndPhase(std::move(s), "");
                  });
}

}  // namespace tandem::router
