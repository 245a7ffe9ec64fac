#include "router/core/orchestrator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "router/core/generate_flow.h"

namespace tandem::router {

Orchestrator::Orchestrator(WorkerRegistry* registry, OrchestratorOptions options)
    : registry_(registry),
      options_(std::move(options)),
      aborts_(std::make_shared<PendingAborts>()),
      executor_(std::max(options_.threads, 1)) {}

Orchestrator::~Orchestrator() {
  // Requests still running end now: their calls are cancelled, and each flow ends once its
  // calls did (a few milliseconds; a ReassignLease in flight: abort_timeout at most).
  std::vector<std::shared_ptr<InFlightRequest>> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, request] : running_) running.push_back(request);
  }
  for (const auto& request : running) {
    request->Cancel(absl::UnavailableError("the router is shutting down"));
  }
  {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
    while (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(5))) {
      LOG(WARNING) << "orchestrator: waiting for " << running_.size() << " requests to end";
    }
  }
  absl::MutexLock lock(&aborts_->mu);
  // Abort calls carry abort_timeout as their deadline, so this wait is bounded; callbacks that
  // come later still find their (shared) counter alive.
  auto done = [p = aborts_.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) { return p->count == 0; };
  aborts_->mu.AwaitWithTimeout(absl::Condition(&done), options_.abort_timeout + absl::Seconds(1));
}

void Orchestrator::Start(v1::GenerateRequest request, Admission admission,
                         const CallerContext* client, std::shared_ptr<ResponseSink> sink) {
  uint64_t key = 0;
  {
    absl::MutexLock lock(&mu_);
    key = next_key_++;
    running_.emplace(key, admission.shared_request());
  }
  StartGenerateFlow(*this, std::move(request), std::move(admission), client, std::move(sink),
                    [this, key] {
                      absl::MutexLock lock(&mu_);
                      running_.erase(key);
                    });
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
