// Small helpers of the load generator (tandem_bench): length distributions and latency
// summaries. Kept apart from the gRPC driver so they are unit-tested (stats_test.cc).
//
// Thread safety: pure functions / value types.
#ifndef TANDEM_TESTS_BENCH_STATS_H_
#define TANDEM_TESTS_BENCH_STATS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::bench {

// A token-length distribution: "N" (fixed) or "LO:HI" (uniform, inclusive), 1 <= LO <= HI.
struct LengthRange {
  uint32_t lo = 1;
  uint32_t hi = 1;
  uint32_t Sample(std::mt19937_64& rng) const {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  }
};

// INVALID_ARGUMENT naming `flag` for anything but "N" or "LO:HI" with 1 <= LO <= HI.
absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view flag, absl::string_view text);

// "inf" (or "0") = all requests at once; else a positive rate in requests/s.
absl::StatusOr<double> ParseRate(absl::string_view text);

// Arrival offsets (seconds from the start) of `n` requests: a Poisson process of `rate` requests
// per second (exponential gaps, the first at 0); all 0 when rate is infinite.
std::vector<double> PoissonArrivals(int n, double rate, std::mt19937_64& rng);

struct Summary {
  int count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles (p in [0, 100]) of `values`; all zero when empty.
Summary Summarize(std::vector<double> values);

}  // namespace tandem::bench

#endif  // TANDEM_TESTS_BENCH_STATS_H_
