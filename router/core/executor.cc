#include "router/core/executor.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace tandem::router {

Executor::Executor(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(Task task) {
  absl::MutexLock lock(&mu_);
  ready_.push_back(std::move(task));
}

void Executor::PostAt(absl::Time when, Task task) {
  absl::MutexLock lock(&mu_);
  timers_.emplace(std::make_pair(when, next_timer_++), std::move(task));
}

void Executor::ReleaseDueLocked(absl::Time now) {
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    ready_.push_back(std::move(timers_.begin()->second));
    timers_.erase(timers_.begin());
  }
}

void Executor::Loop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        ReleaseDueLocked(absl::Now());
        if (!ready_.empty() || stop_) break;
        // Sleeps until a task is posted, the stop, or the earliest timer (Await re-checks on
        // every unlock of mu_, so a new earlier timer wakes the thread too).
        const absl::Time wake =
            timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
        const uint64_t seen = next_timer_;
        auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !ready_.empty() || stop_ || next_timer_ != seen;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
      }
      if (ready_.empty()) return;  // stopping, nothing ready
      task = std::move(ready_.front());
      ready_.pop_front();
    }
    std::move(task)();
  }
}

void Strand::Post(Task task) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
    if (running_) return;  // the draining thread takes it
    running_ = true;
  }
  executor_->Post([self = shared_from_this()] { self->Drain(); });
}

void Strand::Dispatch(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      queue_.push_back(std::move(task));
      return;
    }
    running_ = true;  // this thread holds the strand now
  }
  std::move(task)();
  {
    absl::MutexLock lock(&mu_);
    if (queue_.empty()) {
      running_ = false;
      return;
    }
  }
  executor_->Post([self = shared_from_this()] { self->Drain(); });
}

void Strand::PostAt(absl::Time when, Task task) {
  executor_->PostAt(when, [self = shared_from_this(), task = std::move(task)]() mutable {
    self->Post(std::move(task));
  });
}

void Strand::Drain() {
  // A bounded batch, then the rest goes back to the pool: one busy request cannot hold a
  // thread while others wait.
  for (int i = 0; i < 64; ++i) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        running_ = false;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
  executor_->Post([self = shared_from_this()] { self->Drain(); });
}

}  // namespace tandem::router
