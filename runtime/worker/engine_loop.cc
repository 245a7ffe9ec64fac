#include "runtime/worker/engine_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tandem::runtime {

bool RequestStream::Next(RequestUpdate* update, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
  *update = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void RequestStream::Push(RequestUpdate update) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(update));
}

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, absl::Duration idle_poll)
    : idle_poll_(idle_poll), engine_(std::move(engine)) {
  {
    absl::MutexLock lock(&mu_);
    PublishLocked();
  }
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
  absl::MutexLock lock(&mu_);
  if (by_name_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request '", id, "' is already in flight"));
  }
  const int64_t engine_id = next_engine_id_++;
  absl::Status added = engine_->AddRequest(engine_id, std::move(spec));
  if (!added.ok()) return added;
  auto stream = std::make_shared<RequestStream>(engine_id);
  by_name_[id] = stream;
  names_[engine_id] = id;
  PublishLocked();
  return stream;
}

bool EngineLoop::Abort(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(id);
  if (it == by_name_.end()) return false;
  const int64_t engine_id = it->second->engine_id();
  engine_->Abort(engine_id);
  RequestUpdate final_update;
  final_update.request_id = engine_id;
  final_update.finish_reason = FinishReason::kAborted;
  it->second->Push(std::move(final_update));
  names_.erase(engine_id);
  by_name_.erase(it);
  ++counters_.requests_aborted;
  PublishLocked();
  return true;
}

int64_t EngineLoop::NumInFlight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(by_name_.size());
}

EngineLoopStats EngineLoop::Stats() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

void EngineLoop::TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
  absl::MutexLock lock(&snapshot_mu_);
  added->swap(added_);
  removed->swap(removed_);
  added_.clear();
  removed_.clear();
}

void EngineLoop::PublishLocked() {
  EngineLoopStats stats = counters_;
  stats.num_running = engine_->num_running();
  stats.num_waiting = engine_->num_waiting();
  stats.kv = engine_->kv_cache_stats();
  std::vector<uint64_t> added, removed;
  engine_->TakeCacheEvents(&added, &removed);
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_ = stats;
  added_.insert(added_.end(), added.begin(), added.end());
  removed_.insert(removed_.end(), removed.begin(), removed.end());
}

void EngineLoop::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (!engine_->HasWork()) {
      // Idle: sleep, but wake for new work, shutdown, or the next lease-expiry poll.
      auto wake = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || engine_->HasWork(); };
      mu_.AwaitWithTimeout(absl::Condition(&wake), idle_poll_);
      if (stop_) break;
    }
    absl::StatusOr<std::vector<RequestUpdate>> updates = engine_->Step();
    if (!updates.ok()) {
      // A failed step (a kernel error) fails every request in flight: their KV may be bad.
      LOG(ERROR) << "engine step failed: " << updates.status();
      ++counters_.step_errors;
      for (auto& [name, stream] : by_name_) {
        engine_->Abort(stream->engine_id());
        RequestUpdate failed;
        failed.request_id = stream->engine_id();
        failed.finish_reason = FinishReason::kError;
        failed.error = updates.status();
        stream->Push(std::move(failed));
      }
      by_name_.clear();
      names_.clear();
      PublishLocked();
      continue;
    }
    // Publish before handing out updates: a handler that sees its request finish then reads
    // statistics that include that step.
    for (const RequestUpdate& u : *updates) {
      if (u.finish_reason != FinishReason::kNone && names_.contains(u.request_id)) {
        ++counters_.requests_finished;
      }
    }
    PublishLocked();
    for (RequestUpdate& u : *updates) {
      auto name = names_.find(u.request_id);
      if (name == names_.end()) continue;  // aborted meanwhile
      auto stream = by_name_.find(name->second);
      const bool finished = u.finish_reason != FinishReason::kNone;
      stream->second->Push(std::move(u));
      if (finished) {
        by_name_.erase(stream);
        names_.erase(name);
      }
    }
    // Let handlers waiting for the lock in Submit/Abort in between steps.
    mu_.Unlock();
    std::this_thread::yield();
    mu_.Lock();
  }
}

}  // namespace tandem::runtime
