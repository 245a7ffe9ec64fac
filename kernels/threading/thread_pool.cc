#include "kernels/threading/thread_pool.h"

#include <algorithm>

namespace tandem::kernels {
namespace {
// Set while a thread runs a chunk, so nested ParallelFor calls run inline instead of
// deadlocking on the pool. Thread-local, not shared state.
thread_local bool t_inside_pool_chunk = false;
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  ParallelForGrain(n, 1, fn);
}

void ThreadPool::ParallelForGrain(int64_t n, int64_t grain,
                                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t num_chunks = std::min<int64_t>(num_threads_, units);
  if (num_chunks <= 1 || t_inside_pool_chunk) {
    fn(0, n);
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = std::min(n, (units * c / num_chunks) * grain);
    const int64_t end = std::min(n, (units * (c + 1) / num_chunks) * grain);
    chunks.emplace_back(begin, end);
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    chunks_ = chunks;
    pending_ = static_cast<int>(num_chunks) - 1;
    ++generation_;
  }
  t_inside_pool_chunk = true;
  fn(chunks[0].first, chunks[0].second);
  t_inside_pool_chunk = false;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int worker_index) {
  int64_t seen_generation = 0;
  while (true) {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    std::pair<int64_t, int64_t> chunk;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || generation_ != seen_generation;
      };
      mu_.Await(absl::Condition(&has_work));
      if (shutdown_) return;
      seen_generation = generation_;
      if (worker_index >= static_cast<int>(chunks_.size())) continue;  // fewer chunks than threads
      fn = fn_;
      chunk = chunks_[worker_index];
    }
    t_inside_pool_chunk = true;
    (*fn)(chunk.first, chunk.second);
    t_inside_pool_chunk = false;
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

}  // namespace tandem::kernels
