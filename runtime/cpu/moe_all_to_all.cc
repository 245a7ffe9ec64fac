#include "runtime/cpu/moe_all_to_all.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {
namespace {

// Integers travel as floats (the slot of a row, the row counts): exact below 2^24.
constexpr int64_t kMaxExactInFloat = int64_t{1} << 24;

}  // namespace

absl::Status MoeAllToAll::Run(const kernels::MoeRouting& routing, const ExpertPlacement& placement,
                              const kernels::MoeExpertWeights& experts, const float* x, int64_t H,
                              float* out, kernels::ThreadPool* pool) {
  const int n = group_->size(), me = group_->rank();
  const int64_t T = routing.num_tokens, k = routing.top_k, W = H + 2;
  if (placement.num_ranks() != n) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement over ", placement.num_ranks(),
                                                   " ranks used by a group of ", n));
  }
  if (T * k >= kMaxExactInFloat || placement.num_experts() >= kMaxExactInFloat) {
    return absl::InvalidArgumentError(absl::StrCat("MoE all-to-all: ", T * k, " rows or ",
                                                   placement.num_experts(),
                                                   " experts reach 2^24 (carried as floats)"));
  }
  if (static_cast<int64_t>(slot_in_owner_.size()) != placement.num_experts()) {
    slot_in_owner_.resize(placement.num_experts());
    for (int r = 0; r < n; ++r) {
      const std::vector<int32_t>& held = placement.experts_of(r);
      for (size_t s = 0; s < held.size(); ++s) slot_in_owner_[held[s]] = static_cast<int32_t>(s);
    }
  }
  // Splits: rows per destination, then every rank's row of the [N, N] matrix.
  send_rows_.assign(n, 0);
  for (int64_t r = 0; r < T * k; ++r) ++send_rows_[placement.rank_of(routing.expert_ids[r])];
  counts_.assign(send_rows_.begin(), send_rows_.end());
  all_counts_.resize(static_cast<size_t>(n) * n);
  RETURN_IF_ERROR(group_->AllGather(counts_, absl::MakeSpan(all_counts_)));
  recv_rows_.resize(n);
  for (int src = 0; src < n; ++src) {
    recv_rows_[src] = static_cast<int64_t>(all_counts_[static_cast<size_t>(src) * n + me]);
  }

  // Dispatch: rows grouped by destination rank, (token, choice) order within each.
  offsets_.assign(n + 1, 0);
  for (int d = 0; d < n; ++d) offsets_[d + 1] = offsets_[d] + send_rows_[d];
  send_.resize(T * k * W);
  sent_token_.resize(T * k);
  std::vector<int64_t> next(offsets_.begin(), offsets_.end() - 1);
  for (int64_t r = 0; r < T * k; ++r) {
    const int32_t e = routing.expert_ids[r];
    const int64_t row = next[placement.rank_of(e)]++;
    float* dst = send_.data() + row * W;
    std::copy_n(x + (r / k) * H, H, dst);
    dst[H] = static_cast<float>(slot_in_owner_[e]);
    dst[H + 1] = routing.weights[r];
    sent_token_[row] = static_cast<int32_t>(r / k);
  }
  send_counts_.resize(n);
  recv_counts_.resize(n);
  int64_t received = 0;
  for (int j = 0; j < n; ++j) {
    send_counts_[j] = send_rows_[j] * W;
    recv_counts_[j] = recv_rows_[j] * W;
    received += recv_rows_[j];
  }
  recv_.resize(received * W);
  RETURN_IF_ERROR(group_->AllToAll(send_, send_counts_, absl::MakeSpan(recv_), recv_counts_));

  // Experts: the received rows as a routing of their own (k = 1, this rank's slots).
  received_.num_tokens = received;
  received_.top_k = 1;
  received_.expert_ids.resize(received);
  received_.weights.resize(received);
  expert_x_.resize(received * H);
  expert_out_.resize(received * H);
  for (int64_t r = 0; r < received; ++r) {
    const float* row = recv_.data() + r * W;
    std::copy_n(row, H, expert_x_.data() + r * H);
    const auto slot = static_cast<int32_t>(row[H]);
    if (slot < 0 || slot >= experts.num_experts) {
      return absl::InternalError(absl::StrCat("MoE all-to-all: rank ", me,
                                              " received a row for "
                                              "slot ",
                                              slot, " of its ", experts.num_experts));
    }
    received_.expert_ids[r] = slot;
    received_.weights[r] = row[H + 1];
  }
  if (received > 0) {
    RETURN_IF_ERROR(kernels::cpu::FusedMoe(expert_x_.data(), received_, experts, expert_out_.data(),
                                           pool, &scratch_));
  }

  // Combine: the weighted rows go back the way they came (inverse splits), H floats each.
  for (int j = 0; j < n; ++j) {
    send_counts_[j] = recv_rows_[j] * H;
    recv_counts_[j] = send_rows_[j] * H;
  }
  back_.resize(T * k * H);
  RETURN_IF_ERROR(group_->AllToAll(expert_out_, send_counts_, absl::MakeSpan(back_), recv_counts_));
  std::fill_n(out, T * H, 0.0f);
  for (int64_t row = 0; row < T * k; ++row) {
    float* dst = out + static_cast<int64_t>(sent_token_[row]) * H;
    const float* src = back_.data() + row * H;
    for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
