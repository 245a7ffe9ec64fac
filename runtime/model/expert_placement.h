// Expert parallelism's placement: which rank of a worker group holds each routed expert whole
// (`--tp=N --enable_expert_parallel`, tensor_parallel.h). One value, an expert -> rank table,
// carried from the flags through the weight loader (which experts a rank loads) and the rank's
// config (which routed rows it computes); a contiguous split today, so that a load-balanced
// placement (EPLB) can replace it without touching its users.
//
// Thread safety: an ExpertPlacement is immutable after construction; share it freely.
#ifndef TANDEM_RUNTIME_MODEL_EXPERT_PLACEMENT_H_
#define TANDEM_RUNTIME_MODEL_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::runtime {

class ExpertPlacement {
 public:
  // Rank r holds experts [r*E/N, (r+1)*E/N). INVALID_ARGUMENT naming both numbers unless N >= 1
  // divides E >= 1.
  static absl::StatusOr<ExpertPlacement> Contiguous(int64_t num_experts, int num_ranks);
  // Any table: rank_of_expert[e] in [0, num_ranks) (a rank may hold no expert). INVALID_ARGUMENT
  // naming the first bad entry.
  static absl::StatusOr<ExpertPlacement> FromTable(std::vector<int32_t> rank_of_expert,
                                                   int num_ranks);

  int num_ranks() const { return num_ranks_; }
  int64_t num_experts() const { return static_cast<int64_t>(rank_of_expert_.size()); }
  int rank_of(int64_t expert) const { return rank_of_expert_[expert]; }
  const std::vector<int32_t>& rank_of_expert() const { return rank_of_expert_; }
  // The experts `rank` holds, ascending: the order of its stacked expert weights.
  const std::vector<int32_t>& experts_of(int rank) const { return experts_of_[rank]; }
  // Where each expert sits in `rank`'s stacked weights: [E], -1 for experts other ranks hold.
  std::vector<int32_t> LocalSlots(int rank) const;
  // e.g. "8 experts over 2 ranks: rank 0 [0..3], rank 1 [4..7]" (runs of consecutive ids).
  std::string Describe() const;

 private:
  ExpertPlacement(std::vector<int32_t> rank_of_expert, int num_ranks);

  std::vector<int32_t> rank_of_expert_;
  int num_ranks_ = 1;
  std::vector<std::vector<int32_t>> experts_of_;  // [ranks]
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_EXPERT_PLACEMENT_H_
