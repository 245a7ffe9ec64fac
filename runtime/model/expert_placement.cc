#include "runtime/model/expert_placement.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

ExpertPlacement::ExpertPlacement(std::vector<int32_t> rank_of_expert, int num_ranks)
    : rank_of_expert_(std::move(rank_of_expert)), num_ranks_(num_ranks), experts_of_(num_ranks) {
  for (size_t e = 0; e < rank_of_expert_.size(); ++e) {
    experts_of_[rank_of_expert_[e]].push_back(static_cast<int32_t>(e));
  }
}

absl::StatusOr<ExpertPlacement> ExpertPlacement::Contiguous(int64_t num_experts, int num_ranks) {
  if (num_ranks < 1 || num_experts < 1 || num_experts % num_ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert parallelism over ", num_ranks, " ranks: they do not divide the ",
                     num_experts, " experts (each rank holds experts / ranks whole experts)"));
  }
  std::vector<int32_t> table(num_experts);
  const int64_t per_rank = num_experts / num_ranks;
  for (int64_t e = 0; e < num_experts; ++e) table[e] = static_cast<int32_t>(e / per_rank);
  return ExpertPlacement(std::move(table), num_ranks);
}

absl::StatusOr<ExpertPlacement> ExpertPlacement::FromTable(std::vector<int32_t> rank_of_expert,
                                                           int num_ranks) {
  if (num_ranks < 1 || rank_of_expert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement: ", rank_of_expert.size(),
                                                   " experts over ", num_ranks, " ranks"));
  }
  for (size_t e = 0; e < rank_of_expert.size(); ++e) {
    if (rank_of_expert[e] < 0 || rank_of_expert[e] >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("expert placement: expert ", e, " on rank ",
                                                     rank_of_expert[e], ", not in [0, ", num_ranks,
                                                     ")"));
    }
  }
  return ExpertPlacement(std::move(rank_of_expert), num_ranks);
}

std::vector<int32_t> ExpertPlacement::LocalSlots(int rank) const {
  std::vector<int32_t> slots(rank_of_expert_.size(), -1);
  const std::vector<int32_t>& held = experts_of_[rank];
  for (size_t s = 0; s < held.size(); ++s) slots[held[s]] = static_cast<int32_t>(s);
  return slots;
}

std::string ExpertPlacement::Describe() const {
  std::string out = absl::StrCat(num_experts(), " experts over ", num_ranks_, " ranks:");
  for (int r = 0; r < num_ranks_; ++r) {
    absl::StrAppend(&out, r == 0 ? " rank " : ", rank ", r, " [");
    const std::vector<int32_t>& held = experts_of_[r];
    for (size_t i = 0; i < held.size();) {
      size_t j = i;
      while (j + 1 < held.size() && held[j + 1] == held[j] + 1) ++j;
      absl::StrAppend(&out, i == 0 ? "" : ",", held[i]);
      if (j > i) absl::StrAppend(&out, "..", held[j]);
      i = j + 1;
    }
    absl::StrAppend(&out, "]");
  }
  return out;
}

}  // namespace tandem::runtime
