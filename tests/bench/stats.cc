#include "tests/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {

absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view flag, absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  LengthRange r;
  const bool ok =
      (parts.size() == 1 && absl::SimpleAtoi(parts[0], &r.lo) && (r.hi = r.lo, true)) ||
      (parts.size() == 2 && absl::SimpleAtoi(parts[0], &r.lo) && absl::SimpleAtoi(parts[1], &r.hi));
  if (!ok || r.lo < 1 || r.hi < r.lo) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", text, ": want N or LO:HI (uniform) with 1 <= LO <= HI"));
  }
  return r;
}

absl::StatusOr<double> ParseRate(absl::string_view text) {
  if (text == "inf" || text == "0") return std::numeric_limits<double>::infinity();
  double rate = 0;
  if (!absl::SimpleAtod(text, &rate) || !(rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rate=", text, ": want a positive number of requests/s or inf"));
  }
  return rate;
}

std::vector<double> PoissonArrivals(int n, double rate, std::mt19937_64& rng) {
  std::vector<double> at(std::max(n, 0), 0.0);
  if (std::isinf(rate)) return at;
  std::exponential_distribution<double> gap(rate);
  for (int i = 1; i < n; ++i) at[i] = at[i - 1] + gap(rng);
  return at;
}

Summary Summarize(std::vector<double> values) {
  Summary s;
  s.count = static_cast<int>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  auto rank = [&](double p) {
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    const size_t k = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
    return values[std::min(values.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  s.p50 = rank(50);
  s.p90 = rank(90);
  s.p99 = rank(99);
  s.max = values.back();
  return s;
}

}  // namespace tandem::bench
