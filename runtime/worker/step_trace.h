// What each engine step of a worker ran and how long it took: the per-step record, its
// optional JSON-lines trace (--step_trace), and the step histograms /metrics shows.
//
// A step's time is Engine::Step()'s wall time on the loop thread (with async scheduling: the
// launch of one step plus the collection of the previous one); the gap is the loop's own time
// between two steps (updates handed to the streams, the inbox drained). A served ITL tail is read
// from the trace by joining both to the step's shape (decode-only vs with prompt tokens).
//
// Thread safety: StepTraceWriter is used by the loop thread only; StepMetrics is thread-safe.
#ifndef TANDEM_RUNTIME_WORKER_STEP_TRACE_H_
#define TANDEM_RUNTIME_WORKER_STEP_TRACE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/prometheus.h"
#include "runtime/engine/scheduler.h"

namespace tandem::runtime {

struct StepRecord {
  int64_t step = 0;     // the loop's step index (EngineLoopStats::steps)
  absl::Time start;     // Engine::Step() called
  absl::Duration wall;  // Engine::Step() took
  absl::Duration gap;   // from the previous step's return to this one's call
  StepShape shape;      // Engine::last_step()
  int64_t running = 0;  // after the step
  int64_t waiting = 0;
};

// One JSON object a line:
//   {"step":7,"t_us":1234,"step_us":3180,"gap_us":41,"seqs":2,"decode":2,"prefill_tokens":0,
//    "draft_tokens":0,"tokens":2,"running":2,"waiting":0}
// t_us counts from the writer's creation. Lines past max_lines are dropped (one last line says
// so), so a long-running worker cannot fill its disk.
class StepTraceWriter {
 public:
  // INVALID_ARGUMENT when max_lines < 1; the errno text when `path` cannot be created.
  static absl::StatusOr<std::unique_ptr<StepTraceWriter>> Open(const std::string& path,
                                                               int64_t max_lines);
  ~StepTraceWriter();
  StepTraceWriter(const StepTraceWriter&) = delete;
  StepTraceWriter& operator=(const StepTraceWriter&) = delete;

  void Write(const StepRecord& record);
  int64_t lines() const { return lines_; }

 private:
  StepTraceWriter(std::FILE* file, int64_t max_lines)
      : file_(file), max_lines_(max_lines), origin_(absl::Now()) {}
  std::FILE* const file_;
  const int64_t max_lines_;
  const absl::Time origin_;
  int64_t lines_ = 0;
};

// Step-time buckets (seconds): 0.5 ms to 2.5 s, fine below 20 ms where decode steps fall.
std::vector<double> StepSecondsBuckets();
// Tokens a step fed (vLLM's iteration_tokens buckets): 1 to 16,384.
std::vector<double> StepTokenBuckets();

// The step histograms: time of decode-only steps, time of steps with prompt tokens, and tokens
// a step.
class StepMetrics {
 public:
  void Observe(const StepRecord& record);
  struct Snapshot {
    http::HistogramSnapshot decode_seconds, prefill_seconds, tokens;
  };
  Snapshot Take() const;

 private:
  http::Histogram decode_seconds_{StepSecondsBuckets()};  // thread-safe
  http::Histogram prefill_seconds_{StepSecondsBuckets()};
  http::Histogram tokens_{StepTokenBuckets()};
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_STEP_TRACE_H_
