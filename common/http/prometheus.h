// PrometheusText: the Prometheus text exposition format (version 0.0.4) for `/metrics` — HELP and
// TYPE once per family, label values escaped (\\, \", \n), histograms with cumulative `le`
// buckets ending in +Inf, `_sum` and `_count`. Debian ships no prometheus-cpp; this is the small
// writer the daemons need. Histogram: a thread-safe fixed-bucket accumulator to feed it.
//
// Thread safety: PrometheusText is one scrape's (not thread-safe); Histogram is thread-safe.
#ifndef TANDEM_COMMON_HTTP_PROMETHEUS_H_
#define TANDEM_COMMON_HTTP_PROMETHEUS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace tandem::http {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct HistogramSnapshot {
  std::vector<double> bounds;    // upper bounds, increasing (+Inf implied)
  std::vector<uint64_t> counts;  // per bucket, NOT cumulative; bounds.size() + 1 (last: +Inf)
  double sum = 0;
  uint64_t count = 0;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Histogram bucket edges (seconds) after vLLM's: request latencies (TTFT, end to end) and the
// gaps between streamed tokens.
std::vector<double> LatencyBuckets();
std::vector<double> InterTokenBuckets();

class PrometheusText {
 public:
  void Counter(const std::string& name, const std::string& help, double value,
               const Labels& labels = {});
  void Gauge(const std::string& name, const std::string& help, double value,
             const Labels& labels = {});
  void Histogram(const std::string& name, const std::string& help, const HistogramSnapshot& h,
                 const Labels& labels = {});
  const std::string& text() const { return out_; }

  static std::string EscapeLabelValue(const std::string& value);

 private:
  void Family(const std::string& name, const std::string& help, const char* type);
  void Sample(const std::string& name, const Labels& labels, double value);
  std::string out_;
  absl::flat_hash_set<std::string> families_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_PROMETHEUS_H_
