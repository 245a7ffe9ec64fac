#include "kernels/moe/moe_dispatch.h"

#include "absl/strings/str_cat.h"

namespace tandem::kernels {

absl::StatusOr<MoeDispatchPlan> PlanMoeDispatch(absl::Span<const int32_t> expert_ids, int64_t top_k,
                                                absl::Span<const int32_t> rank_of_expert,
                                                int num_ranks) {
  const int64_t pairs = static_cast<int64_t>(expert_ids.size());
  if (num_ranks < 1 || num_ranks > kMoeDispatchMaxRanks || top_k < 1 || pairs % top_k != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PlanMoeDispatch: ", num_ranks, " ranks (1..",
                                                   kMoeDispatchMaxRanks, "), ", pairs,
                                                   " routing pairs of top-", top_k));
  }
  const int64_t T = pairs / top_k, E = static_cast<int64_t>(rank_of_expert.size());
  MoeDispatchPlan plan;
  plan.num_ranks = num_ranks;
  plan.pos.assign(T * num_ranks, -1);
  plan.counts.assign(num_ranks, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = expert_ids[t * top_k + j];
      if (e < 0 || e >= E || rank_of_expert[e] < 0 || rank_of_expert[e] >= num_ranks) {
        return absl::InvalidArgumentError(absl::StrCat("PlanMoeDispatch: token ", t, " choice ", j,
                                                       ": expert ", e, " of ", E,
                                                       " or its rank out of range"));
      }
      int32_t& p = plan.pos[t * num_ranks + rank_of_expert[e]];
      if (p < 0) p = plan.counts[rank_of_expert[e]]++;
    }
  }
  return plan;
}

absl::StatusOr<std::vector<int32_t>> MoeDispatchFixedRows(const MoeDispatchPlan& plan,
                                                          int64_t capacity) {
  const int n = plan.num_ranks;
  if (n < 1 || capacity < 1 || static_cast<int>(plan.counts.size()) != n ||
      plan.pos.size() % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE fixed dispatch: capacity ", capacity, " over a plan of ", n, " ranks"));
  }
  for (int d = 0; d < n; ++d) {
    if (plan.counts[d] > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("MoE fixed dispatch: ", plan.counts[d],
                                                     " rows to rank ", d, ", capacity ", capacity));
    }
  }
  std::vector<int32_t> rows(n * capacity, -1);
  const int64_t T = static_cast<int64_t>(plan.pos.size()) / n;
  for (int64_t t = 0; t < T; ++t) {
    for (int d = 0; d < n; ++d) {
      const int32_t p = plan.pos[t * n + d];
      if (p >= 0) rows[d * capacity + p] = static_cast<int32_t>(t);
    }
  }
  return rows;
}

void MoeDispatchRowMeta(absl::Span<const int32_t> expert_ids, absl::Span<const float> weights,
                        int64_t t, int64_t top_k, int dest,
                        absl::Span<const int32_t> rank_of_expert,
                        absl::Span<const int32_t> slot_in_owner, int32_t* slots_out,
                        float* weights_out) {
  for (int64_t j = 0; j < top_k; ++j) {
    const int32_t e = expert_ids[t * top_k + j];
    const bool here = rank_of_expert[e] == dest;
    slots_out[j] = here ? slot_in_owner[e] : -1;
    weights_out[j] = here ? weights[t * top_k + j] : 0.0f;
  }
}

absl::StatusOr<MoeDispatchSplits> MoeDispatchSplitsOf(absl::Span<const int32_t> all_counts,
                                                      int num_ranks, int rank,
                                                      int64_t max_received) {
  const int n = num_ranks;
  if (n < 1 || rank < 0 || rank >= n || static_cast<int64_t>(all_counts.size()) != int64_t{n} * n) {
    return absl::InvalidArgumentError(absl::StrCat("MoE dispatch: rank ", rank, " of ", n,
                                                   " with a counts matrix of ", all_counts.size()));
  }
  MoeDispatchSplits s;
  s.send_rows.resize(n);
  s.recv_rows.resize(n);
  for (int d = 0; d < n; ++d) {
    const int32_t out = all_counts[static_cast<size_t>(rank) * n + d];
    const int32_t in = all_counts[static_cast<size_t>(d) * n + rank];
    if (out < 0 || in < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MoE dispatch: negative row count between ranks ", rank, " and ", d));
    }
    s.send_rows[d] = out;
    s.recv_rows[d] = in;
    s.sent += out;
    s.received += in;
  }
  if (s.received > max_received) {
    return absl::InvalidArgumentError(absl::StrCat("MoE dispatch: rank ", rank, " receives ",
                                                   s.received, " rows, its buffers hold ",
                                                   max_received));
  }
  return s;
}

}  // namespace tandem::kernels
