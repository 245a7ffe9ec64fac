// A fixed pool of worker threads for data-parallel CPU kernels.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(rows, [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
//
// ParallelFor splits [0, n) into at most num_threads() contiguous chunks, runs them on the pool
// (the calling thread takes one chunk), and returns when all are done. Nested ParallelFor from
// inside a chunk runs inline. Kernels take a `ThreadPool*` that may be null: null means run on
// the calling thread.
//
// Thread safety: ParallelFor may be called from one thread at a time per pool (the engine's step
// loop); concurrent callers are serialized.
#ifndef TANDEM_KERNELS_THREADING_THREAD_POOL_H_
#define TANDEM_KERNELS_THREADING_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kernels {

class ThreadPool {
 public:
  // num_threads <= 1 creates no threads: ParallelFor then runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(begin, end) over a partition of [0, n); n <= 0 does nothing.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(call_mu_, mu_);

  // Like ParallelFor, but chunk boundaries are multiples of `grain` (except the last), so
  // callers can keep cache-blocked tiles whole.
  void ParallelForGrain(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(call_mu_, mu_);

 private:
  void WorkerLoop(int worker_index) ABSL_LOCKS_EXCLUDED(mu_);

  const int num_threads_;
  std::vector<std::thread> workers_;
  absl::Mutex call_mu_;  // serializes ParallelFor callers
  absl::Mutex mu_;
  // The job being run: chunks [0, num_chunks_) of fn_; worker i runs chunk i + 1.
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::pair<int64_t, int64_t>> chunks_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_THREADING_THREAD_POOL_H_
