#include "runtime/engine/dp_rank.h"

namespace tandem::runtime {

int64_t PickDpRank(absl::Span<const DpRankLoad> loads) {
  int64_t best = 0;
  for (int64_t r = 1; r < static_cast<int64_t>(loads.size()); ++r) {
    const DpRankLoad& a = loads[r];
    const DpRankLoad& b = loads[best];
    if (a.requests < b.requests || (a.requests == b.requests && a.free_blocks > b.free_blocks)) {
      best = r;
    }
  }
  return best;
}

}  // namespace tandem::runtime
