// Data-parallel attention's request placement (`--dp_attention`; runtime/model/tensor_parallel.h,
// "Wide expert parallelism"): the group's N ranks each run attention for their own requests and
// keep those requests' KV in their own pool (KvCacheConfig::dp_size). Rank 0's one scheduler
// assigns a request to a DP rank when it is added and never moves it (its KV lives there: a
// preempted request recomputes on the same rank); every step then holds one batch per DP rank
// (ScheduledSeq::dp_rank), a rank without requests running an empty one.
//
// Policy (SGLang's shortest-queue dispatch, with the KV pool and round robin as tie-breaks): the
// rank with the fewest requests assigned and not finished, then the most free KV blocks, then the
// first after the previous pick in rank order (so requests arriving one at a time on an idle group
// still alternate between the ranks).
//
// Thread safety: pure functions over plain values.
#ifndef TANDEM_RUNTIME_ENGINE_DP_RANK_H_
#define TANDEM_RUNTIME_ENGINE_DP_RANK_H_

#include <cstdint>

#include "absl/types/span.h"

namespace tandem::runtime {

// One DP rank's load when a request arrives.
struct DpRankLoad {
  int64_t requests = 0;     // assigned, not finished (waiting, running or loading)
  int64_t free_blocks = 0;  // free blocks in the rank's KV pool
};

// The DP rank for a new request (the policy above; `previous`: the last pick, -1 for none); 0 for
// an empty span.
int64_t PickDpRank(absl::Span<const DpRankLoad> loads, int64_t previous = -1);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_DP_RANK_H_
