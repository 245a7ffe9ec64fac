// GenerateFlow: one request's state machine (generate_flow.h has the picture). Private to
// :orchestrator: generate_flow.cc (routing, the mixed worker's stream, relaying to the client,
// failures, the end) and generate_flow_pd.cc (the P -> D stages) define its steps.
#ifndef TANDEM_ROUTER_CORE_GENERATE_FLOW_INTERNAL_H_
#define TANDEM_ROUTER_CORE_GENERATE_FLOW_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "router/core/executor.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/core/routing_policy.h"
#include "router/core/validation.h"
#include "router/core/worker_client.h"
#include "router/core/worker_registry.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class GenerateFlow final : public std::enable_shared_from_this<GenerateFlow> {
 public:
  GenerateFlow(Orchestrator& orch, v1::GenerateRequest request, Admission admission,
               const CallerContext* client, std::shared_ptr<ResponseSink> sink, Task on_end)
      : orch_(orch),
        strand_(std::make_shared<Strand>(&orch.executor())),
        request_(std::move(request)),
        flight_(admission.shared_request()),
        admission_(std::move(admission)),
        client_(client),
        sink_(std::move(sink)),
        on_end_(std::move(on_end)),
        start_(absl::Now()) {
    deadline_ = start_ + orch_.options().request_timeout;
    if (client_ != nullptr) deadline_ = std::min(deadline_, client_->deadline());
    trace_.set_request_id(flight_->id());
    trace_.set_start_unix_micros(absl::ToUnixMicros(start_));
  }

  void Begin() {
    Post(shared_from_this(), [](GenerateFlow& f) {
      // The one shape check (limits.h), here for every entry (gRPC, the HTTP API, ...), so no
      // request reaches a worker without it; the model's own limits follow once routed.
      if (absl::Status s = ValidateRequestShape(f.request_); !s.ok()) return f.Done(s);
      f.Route();
    });
  }

 private:
  enum class Phase { kDecode, kMixed };
  // What a stream relayed so far.
  struct Relay {
    bool finished = false;     // a message with finish_reason was relayed
    bool client_gone = false;  // a Send to the client failed
    bool got_any = false;      // the worker sent at least one message
  };
  using FailureNext = absl::AnyInvocable<void(GenerateFlow&, absl::Status, bool retriable) &&>;
  using ClientNext = absl::AnyInvocable<void(GenerateFlow&, bool cancelled) &&>;

  // Runs `step` on the flow's strand: queued (Post), or from a completion callback at once on the
  // callback's thread when the strand is idle (Continue). A copy of the strand is held across
  // the call: the flow (and its strand) may end on another thread as soon as the step is queued.
  template <typename Step>
  static void Post(std::shared_ptr<GenerateFlow> self, Step step) {
    const std::shared_ptr<Strand> strand = self->strand_;
    strand->Post(
        [self = std::move(self), step = std::move(step)]() mutable { std::move(step)(*self); });
  }
  template <typename Step>
  static void Continue(std::shared_ptr<GenerateFlow> self, Step step) {
    const std::shared_ptr<Strand> strand = self->strand_;
    strand->Dispatch(
        [self = std::move(self), step = std::move(step)]() mutable { std::move(step)(*self); });
  }
  template <typename Step>
  static void PostAt(std::shared_ptr<GenerateFlow> self, absl::Time when, Step step) {
    const std::shared_ptr<Strand> strand = self->strand_;
    strand->PostAt(when, [self = std::move(self), step = std::move(step)]() mutable {
      std::move(step)(*self);
    });
  }

  // Routing, the mixed worker's stream, relaying, the end (generate_flow.cc).
  void Route();
  // No route, but a worker is in its short failure backoff: routes again in a moment (true), up
  // to OrchestratorOptions::route_wait and half the time left to the deadline (then false).
  bool WaitForRoute();
  // The next poll of a bounded wait (WaitForRoute: `*until` = route_wait_until_ and `budget` =
  // route_wait; WaitForDecode: decode_wait_until_, decode_wait): kRouteWaitPoll from now, or
  // nullopt once that wait's time is spent (`budget` from its first poll, never past half of the
  // time then left to the deadline; one budget for all the request's waits of that kind).
  std::optional<absl::Time> NextWaitPoll(absl::Time* until, absl::Duration budget);
  // At a wait's poll: when the request was interrupted meanwhile (Router.Abort, shutdown, the
  // client cancelled), ends it (its workers aborted first when `abort_workers`) and says so.
  bool EndIfInterrupted(bool abort_workers);
  void StartMixed(const RoutePlan& plan, const RoutingSnapshot& snap);
  void StartStream(std::unique_ptr<StreamCall> stream, Phase phase);
  void OnStreamMessage(v1::GenerateResponse chunk);
  void OnStreamDone(const absl::Status& status);
  void OnMixedEnded(const absl::Status& status);
  // A phase's result: the status for the client, or "retry this phase without that worker".
  void EndPhase(absl::Status status, std::string retry_without);
  absl::Status FinishAborted();
  // The request's end: trace, metrics, slots and admission released, then the sink told.
  void Done(const absl::Status& status);

  // The P -> D stages (generate_flow_pd.cc): P prefills, its first token goes out, D decodes.
  void StartDisaggregated(const RoutePlan& plan, const RoutingSnapshot& snap);
  void OnPrefilled(absl::StatusOr<v1::PrefillResponse> answered);
  void StartDecode();
  // The KV lease P holds for this request moves to `decode_worker` (P serves no other reader),
  // then the decode restarts there. Best effort: if P does not answer, the new decode worker
  // finds the source unreachable or the lease not its own, and recomputes or fails as for any
  // KV failure.
  bool ReplaceDecode(const absl::Status& failure);
  // D failed before a token of its own, its connection is down and no other decode worker is
  // free: polls (NextWaitPoll) for another one (ReplaceDecode) or for D's connection to be back
  // (WorkerClient::Connected: a link that came back, gRPC reconnecting), then decodes there.
  // False when no time is left to wait.
  bool WaitForDecode(const absl::Status& failure);
  // The decode starts again on the decode worker that failed (its connection is back); the
  // request fails with `failure` when that worker is no longer registered.
  void RetryDecode(const absl::Status& failure);
  void OnDecodeEnded(const absl::Status& status);

  // Failures, calls, the client (generate_flow.cc).
  // The client's status for a failed worker call (`slot` stays valid until `next` ran): marks
  // the worker failed for faults and passes retriable=true then.
  void ClassifyFailure(WorkerSlot* slot, absl::Status status, std::string phase, FailureNext next);
  absl::Status Failure(WorkerSlot& slot, const absl::Status& status, absl::string_view phase,
                       bool* retriable);
  // Runs `next` once it is known whether the client cancelled. A worker call cut by the
  // client's cancel ends CANCELLED possibly a moment before the server context reports it, so
  // for CANCELLED this re-checks every 2 ms until `until` (a timer, not a sleep).
  void CheckClientCancelled(absl::StatusCode code, absl::Time until, ClientNext next);
  CallOptions NewCallOptions() const;
  bool Send(v1::GenerateResponse& chunk);
  v1::Usage FinalUsage() const;
  void AbortWorkers();
  // Microseconds since the router took the request (never 0, so 0 stays "did not happen").
  uint64_t Since() const;
  int MaxAttempts() const { return std::max(orch_.options().max_attempts, 1); }
  // The limits a request must fit on both workers (the same one twice for a mixed worker).
  static ModelLimits LimitsOf(const v1::WorkerInfo& a, const v1::WorkerInfo& b);
  WorkerRegistry& registry() const { return orch_.registry(); }

  Orchestrator& orch_;
  const std::shared_ptr<Strand> strand_;
  const v1::GenerateRequest request_;
  const std::shared_ptr<InFlightRequest> flight_;
  std::optional<Admission> admission_;
  const CallerContext* const client_;
  std::shared_ptr<ResponseSink> sink_;
  Task on_end_;
  const absl::Time start_;
  absl::Time deadline_;
  v1::RequestTrace trace_;
  // Counted for the client's usage and the metrics.
  uint32_t completion_tokens_ = 0;
  uint32_t cached_tokens_ = 0;
  int64_t sent_tokens_ = 0;
  absl::Time first_sent_, last_sent_;
  // Routing.
  int attempt_ = 1;
  absl::flat_hash_set<std::string> excluded_;
  absl::Time route_wait_until_ = absl::InfinitePast();   // set by the first WaitForRoute
  absl::Time decode_wait_until_ = absl::InfinitePast();  // set by the first WaitForDecode
  std::vector<WorkerRef> touched_;  // workers that saw the request (Abort targets)
  // The P/D phase: P until it answered, then D (or the mixed worker) until the end.
  std::unique_ptr<WorkerSlot> prefill_slot_, stream_slot_;
  std::unique_ptr<PrefillCall> prefill_call_;
  std::unique_ptr<StreamCall> stream_;
  Phase phase_ = Phase::kMixed;
  Relay relay_;
  v1::WorkerInfo prefill_info_;
  std::shared_ptr<WorkerClient> prefill_client_;  // holds the KV lease during decode
  v1::DecodeRequest decode_request_;
  int decode_attempt_ = 0;
  absl::flat_hash_set<std::string> decode_tried_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_GENERATE_FLOW_INTERNAL_H_
