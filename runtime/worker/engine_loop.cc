#include "runtime/worker/engine_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tandem::runtime {

bool RequestStream::Next(RequestUpdate* update, absl::Duration timeout, int64_t* step) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
  *update = std::move(queue_.front().update);
  if (step != nullptr) *step = queue_.front().step;
  queue_.pop_front();
  return true;
}

void RequestStream::Push(RequestUpdate update, int64_t step) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Item{std::move(update), step});
}

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, EngineLoopOptions options)
    : options_(options), engine_(std::move(engine)) {
  Publish();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::StatusOr<std::shared_ptr<RequestStream>> EngineLoop::Submit(const std::string& id,
                                                                  RequestSpec spec) {
  // Outside the lock: validation reads only the engine's creation-time limits.
  if (absl::Status valid = engine_->ValidateRequest(spec); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (by_name_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request '", id, "' is already in flight"));
  }
  const int64_t queued = queued_submissions_ + draining_submissions_ + engine_waiting_;
  if (queued >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat("worker queue is full: ", queued,
                                                     " requests wait to run (limit ",
                                                     options_.max_queued_requests, ")"));
  }
  const int64_t engine_id = next_engine_id_++;
  spec.external_id = id;
  if (spec.arrival == absl::InfinitePast()) spec.arrival = absl::Now();
  auto stream = std::make_shared<RequestStream>(engine_id, steps_);
  by_name_[id] = stream;
  names_[engine_id] = id;
  inbox_.push_back(Op{Op::Kind::kSubmit, engine_id, std::move(spec)});
  ++queued_submissions_;
  return stream;
}

bool EngineLoop::Abort(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(id);
  if (it == by_name_.end()) return false;
  const int64_t engine_id = it->second->engine_id();
  // Even a submission still in the inbox goes to the engine and is aborted there (in the same
  // step): the engine's abort is what releases a remote KV lease the request carries.
  inbox_.push_back(Op{Op::Kind::kAbort, engine_id, {}});
  RequestUpdate final_update;
  final_update.request_id = engine_id;
  final_update.finish_reason = FinishReason::kAborted;
  it->second->Push(std::move(final_update), steps_);
  names_.erase(engine_id);
  by_name_.erase(it);
  ++requests_aborted_;
  return true;
}

int64_t EngineLoop::NumInFlight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(by_name_.size());
}

EngineLoopStats EngineLoop::Stats() const {
  EngineLoopStats stats;
  {
    absl::MutexLock lock(&snapshot_mu_);
    stats = snapshot_;
  }
  absl::MutexLock lock(&mu_);
  stats.num_waiting += queued_submissions_ + draining_submissions_;
  stats.requests_aborted = requests_aborted_;
  return stats;
}

void EngineLoop::TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
  absl::MutexLock lock(&snapshot_mu_);
  added->swap(added_);
  removed->swap(removed_);
  added_.clear();
  removed_.clear();
}

std::vector<uint64_t> EngineLoop::CachedHashes() const {
  absl::MutexLock lock(&snapshot_mu_);
  return std::vector<uint64_t>(cached_.begin(), cached_.end());
}

void EngineLoop::Publish() {
  EngineLoopStats stats;
  stats.num_running = engine_->num_running();
  stats.num_waiting = engine_->num_waiting();
  stats.kv = engine_->kv_cache_stats();
  stats.requests_finished = requests_finished_;
  stats.step_errors = step_errors_;
  stats.steps = steps_done_;
  stats.kv_recomputes = engine_->num_kv_recomputes();
  stats.spec = engine_->spec_stats();
  stats.mtp_handoffs = engine_->mtp() != nullptr ? engine_->mtp()->num_handoffs() : 0;
  stats.moe_expert_tokens = engine_->executor_stats().moe_expert_tokens;
  std::vector<uint64_t> added, removed;
  engine_->TakeCacheEvents(&added, &removed);
  {
    absl::MutexLock lock(&snapshot_mu_);
    snapshot_ = stats;
    // Every add of a hash is followed by its remove before it can be added again, so applying
    // a step's adds before its removes leaves exactly the cached set.
    for (uint64_t h : added) cached_.insert(h);
    for (uint64_t h : removed) cached_.erase(h);
    added_.insert(added_.end(), added.begin(), added.end());
    removed_.insert(removed_.end(), removed.begin(), removed.end());
  }
  absl::MutexLock lock(&mu_);
  engine_waiting_ = stats.num_waiting;
  draining_submissions_ = 0;
}

void EngineLoop::Apply(std::deque<Op> ops, int64_t step) {
  for (Op& op : ops) {
    if (op.kind == Op::Kind::kAbort) {
      engine_->Abort(op.engine_id);
      continue;
    }
    absl::Status added = engine_->AddRequest(op.engine_id, std::move(op.spec));
    if (added.ok()) continue;
    // Submit validated it already; anything left is a bug, reported on the request.
    LOG(ERROR) << "request " << op.engine_id << " validated but not added: " << added;
    RequestUpdate failed;
    failed.request_id = op.engine_id;
    failed.finish_reason = FinishReason::kError;
    failed.error = added;
    Deliver({std::move(failed)}, step);
  }
}

void EngineLoop::Deliver(std::vector<RequestUpdate> updates, int64_t step) {
  std::vector<uint64_t> orphan_leases;
  {
    absl::MutexLock lock(&mu_);
    DeliverLocked(updates, step, &orphan_leases);
  }
  // Aborted while the step that finished it ran: nobody will hand its KV to a reader.
  for (uint64_t lease : orphan_leases) {
    if (options_.release_orphan_lease) options_.release_orphan_lease(lease);
  }
}

void EngineLoop::DeliverLocked(std::vector<RequestUpdate>& updates, int64_t step,
                               std::vector<uint64_t>* orphan_leases) {
  for (RequestUpdate& u : updates) {
    auto name = names_.find(u.request_id);
    if (name == names_.end()) {  // aborted meanwhile
      if (u.kv_lease.has_value()) orphan_leases->push_back(u.kv_lease->lease.lease_id);
      continue;
    }
    auto stream = by_name_.find(name->second);
    const bool finished = u.finish_reason != FinishReason::kNone;
    stream->second->Push(std::move(u), step);
    if (finished) {
      by_name_.erase(stream);
      names_.erase(name);
    }
  }
}

void EngineLoop::FailAll(const absl::Status& error, int64_t step) {
  LOG(ERROR) << "engine step failed: " << error;
  ++step_errors_;
  absl::MutexLock lock(&mu_);
  for (auto& [name, stream] : by_name_) {
    engine_->Abort(stream->engine_id());
    RequestUpdate failed;
    failed.request_id = stream->engine_id();
    failed.finish_reason = FinishReason::kError;
    failed.error = error;
    stream->Push(std::move(failed), step);
  }
  // Submissions still in the inbox were failed above too; drop them.
  inbox_.clear();
  queued_submissions_ = 0;
  by_name_.clear();
  names_.clear();
}

void EngineLoop::RecordStep(int64_t step, absl::Time start) {
  const absl::Time end = absl::Now();
  const absl::Time previous_end = last_step_end_;
  last_step_end_ = end;
  StepRecord record;
  record.shape = engine_->last_step();
  if (record.shape.seqs == 0) return;  // no model step (only KV loads or lease expiry)
  record.step = step;
  record.start = start;
  record.wall = end - start;
  record.gap = previous_end == absl::InfinitePast() ? absl::ZeroDuration() : start - previous_end;
  record.running = engine_->num_running();
  record.waiting = engine_->num_waiting();
  step_metrics_.Observe(record);
  if (options_.step_trace != nullptr) options_.step_trace->Write(record);
}

void EngineLoop::Run() {
  bool poll_due = false;
  while (true) {
    // One round = one step index: take the inbox and number the step in one critical section,
    // so whatever a handler queues while step S runs is in the engine before step S + 1.
    const bool has_work = engine_->HasWork();
    std::deque<Op> ops;
    int64_t step = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!has_work && !poll_due && inbox_.empty()) {
        // Idle: sleep until something arrives, shutdown, or the next lease-expiry poll (an
        // engine step with nothing to run still lets the connector expire leases).
        auto wake = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !inbox_.empty(); };
        poll_due = !mu_.AwaitWithTimeout(absl::Condition(&wake), options_.idle_poll);
        continue;
      }
      ops.swap(inbox_);
      draining_submissions_ = queued_submissions_;
      queued_submissions_ = 0;
      step = ++steps_;
    }
    Apply(std::move(ops), step);
    if (!engine_->HasWork() && !poll_due) {
      // Only aborts (or submissions that failed): nothing to run, but the blocks are free now.
      ++steps_done_;
      Publish();
      continue;
    }
    poll_due = false;
    const absl::Time step_start = absl::Now();
    absl::StatusOr<std::vector<RequestUpdate>> updates = engine_->Step();
    ++steps_done_;
    RecordStep(step, step_start);
    for (absl::Duration queued : engine_->TakeQueueTimes()) {
      queue_time_.Observe(absl::ToDoubleSeconds(queued));
    }
    if (!updates.ok()) {
      FailAll(updates.status(), step);
      Publish();
      continue;
    }
    for (const RequestUpdate& u : *updates) {
      if (u.finish_reason != FinishReason::kNone && u.finish_reason != FinishReason::kAborted) {
        ++requests_finished_;
      }
    }
    // Publish before handing out updates: a handler that sees its request finish then reads
    // statistics that include that step.
    Publish();
    Deliver(*std::move(updates), step);
    if (engine_->HasWork() && engine_->num_running() == engine_->num_loading() &&
        engine_->num_waiting() == 0) {
      // Only remote KV loads in flight: poll them without spinning a core, but wake at once
      // for new work.
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !inbox_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Microseconds(200));
    }
  }
}

}  // namespace tandem::runtime
