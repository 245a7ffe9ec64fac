// Executor and Strand: where the router's asynchronous request flows run (orchestrator.h).
//
// Executor: a fixed pool of threads running posted tasks, at once (Post) or at a time (PostAt,
// for the few timed checks a flow makes). The pool's size, not the number of requests in
// flight, is what the router spends on threads: a request waiting for a worker is a state
// machine parked in its completion callbacks, not a blocked thread.
//
// Strand: tasks posted to one strand run one at a time, in the order posted, on the executor's
// threads. A request's flow owns one, so the flow's state needs no lock of its own and its
// completion callbacks, which gRPC (or a test's fake) may run on any thread, even inline inside
// the call that started the operation, only ever post to it: no re-entrancy, no lock held
// across a worker call.
//
// Tasks must not block: a blocked task holds one of the pool's few threads.
//
// Thread safety: Post/PostAt from any thread, tasks included. ~Executor runs the tasks already
// queued (timers not yet due are dropped), then joins; nothing may post after it started.
#ifndef TANDEM_ROUTER_CORE_EXECUTOR_H_
#define TANDEM_ROUTER_CORE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

using Task = absl::AnyInvocable<void() &&>;

class Executor {
 public:
  // REQUIRES: threads >= 1.
  explicit Executor(int threads);
  ~Executor();

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Post(Task task);
  // Runs `task` at `when` or soon after (at once when it is past).
  void PostAt(absl::Time when, Task task);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  // Moves the timers due by `now` to the ready queue.
  void ReleaseDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<Task> ready_ ABSL_GUARDED_BY(mu_);
  // (due time, sequence) -> task: equal times run in posting order.
  std::map<std::pair<absl::Time, uint64_t>, Task> timers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class Strand : public std::enable_shared_from_this<Strand> {
 public:
  // `executor` outlives the strand's tasks.
  explicit Strand(Executor* executor) : executor_(executor) {}

  void Post(Task task);
  // Runs `task` at once on the calling thread when the strand is idle (no task running or
  // queued), else as Post: a completion callback continues its request without a thread hop.
  // Tasks queued meanwhile go on on the executor.
  void Dispatch(Task task);
  void PostAt(absl::Time when, Task task);

 private:
  // Runs queued tasks until none is left (on an executor thread).
  void Drain();

  Executor* const executor_;
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_EXECUTOR_H_
