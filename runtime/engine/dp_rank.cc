#include "runtime/engine/dp_rank.h"

namespace tandem::runtime {

int64_t PickDpRank(absl::Span<const DpRankLoad> loads, int64_t previous) {
  const auto n = static_cast<int64_t>(loads.size());
  if (n == 0) return 0;
  // Candidates in round-robin order from the one after `previous`; the first strictly better wins.
  const int64_t first = ((previous + 1) % n + n) % n;
  int64_t best = first;
  for (int64_t i = 1; i < n; ++i) {
    const int64_t r = (first + i) % n;
    const DpRankLoad& a = loads[r];
    const DpRankLoad& b = loads[best];
    if (a.requests < b.requests || (a.requests == b.requests && a.free_blocks > b.free_blocks)) {
      best = r;
    }
  }
  return best;
}

}  // namespace tandem::runtime
