// Wide expert parallelism's dispatch plan (DP attention + EP: runtime/cuda/cuda_moe_all_to_all.h):
// the host reference of moe_dispatch_cuda.h's kernels and the host half of the split exchange.
//
// Each rank routes its own T tokens (top-k global expert ids); a token goes to a rank ONCE, however
// many of its k experts that rank holds (rows deduplicated per destination rank), as one row of
//   [ x (H elements of the activation dtype) | k int32 slots | k fp32 weights | padding ]
// where slot j is the choice's expert slot on the destination rank (its index in that rank's
// stacked experts, ExpertPlacement::experts_of) and -1 with weight 0 when another rank holds
// choice j. The receiver computes each row as a token of its own routed to its experts (the -1
// choices to an all-zero expert with weight 0: kernels/moe/moe_ep_cuda.h's convention) and sends
// back ONE row per received row: the weighted sum of its experts' outputs. The sender's token
// output is the sum of its rows that come back, in rank order.
//
// The plan orders the rows sent to each rank by token (stable): pos[t, d] is token t's row among
// those sent to rank d, or -1. The rows to rank d start at the exclusive prefix sum of counts.
//
// Thread safety: functions are reentrant.
#ifndef TANDEM_KERNELS_MOE_MOE_DISPATCH_H_
#define TANDEM_KERNELS_MOE_MOE_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::kernels {

// Ranks a dispatch plan handles (a bit mask per token on the device).
inline constexpr int kMoeDispatchMaxRanks = 32;

// Width of one dispatch row in 2-byte units: hidden, then 8 bytes per choice rounded up to 16
// bytes, so that rows stay 16-byte aligned for any hidden % 8 == 0.
inline int64_t MoeDispatchRowWidth(int64_t hidden, int64_t top_k) {
  return hidden + (4 * top_k + 7) / 8 * 8;
}

struct MoeDispatchPlan {
  int num_ranks = 0;
  std::vector<int32_t> pos;     // [T, num_ranks]: token t's row among those sent to rank d, or -1
  std::vector<int32_t> counts;  // [num_ranks]: rows sent to each rank
};

// The plan of expert_ids [T, k] (global ids) under rank_of_expert [E]. INVALID_ARGUMENT for
// num_ranks outside [1, kMoeDispatchMaxRanks], a size mismatch or an id / rank out of range.
absl::StatusOr<MoeDispatchPlan> PlanMoeDispatch(absl::Span<const int32_t> expert_ids, int64_t top_k,
                                                absl::Span<const int32_t> rank_of_expert,
                                                int num_ranks);

// The fixed-capacity layout of the send buffer (CUDA graphs: every pair of ranks exchanges
// exactly `capacity` rows, so the all-to-all's sizes are host constants and no counts are read
// back): [num_ranks * capacity], the token of each row (rank d's rows at [d * capacity, d *
// capacity + counts[d]) in plan order) or -1 for a padding row (sent with every slot -1: the
// receiver's zero expert). INVALID_ARGUMENT, naming the numbers, when a rank gets more rows than
// `capacity` (it never does for capacity >= T: each token goes to a rank at most once).
absl::StatusOr<std::vector<int32_t>> MoeDispatchFixedRows(const MoeDispatchPlan& plan,
                                                          int64_t capacity);

// The metadata of token t's row for rank `dest` (the pack kernel's): slots[j] = slot_in_owner[e]
// when rank_of_expert[e] == dest (e = expert_ids[t*k + j]), else -1; weights[j] alike or 0.
void MoeDispatchRowMeta(absl::Span<const int32_t> expert_ids, absl::Span<const float> weights,
                        int64_t t, int64_t top_k, int dest,
                        absl::Span<const int32_t> rank_of_expert,
                        absl::Span<const int32_t> slot_in_owner, int32_t* slots_out,
                        float* weights_out);

// This rank's side of one exchange, from the all-gathered counts ([N, N]: row s = the rows rank
// s sends to each rank).
struct MoeDispatchSplits {
  std::vector<int64_t> send_rows;  // [N] rows this rank sends to each rank (= its counts)
  std::vector<int64_t> recv_rows;  // [N] rows it receives from each rank
  int64_t sent = 0;
  int64_t received = 0;
};

// INVALID_ARGUMENT for a matrix of another size, a negative count, or more than max_received
// rows to receive (the receiver's buffers), naming the numbers.
absl::StatusOr<MoeDispatchSplits> MoeDispatchSplitsOf(absl::Span<const int32_t> all_counts,
                                                      int num_ranks, int rank,
                                                      int64_t max_received);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_MOE_MOE_DISPATCH_H_
