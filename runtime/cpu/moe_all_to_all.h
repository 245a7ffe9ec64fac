// Wide expert parallelism's MoE step on the CPU backend (`--dp_attention` with
// `--enable_expert_parallel`; runtime/model/tensor_parallel.h): every rank routes ITS OWN tokens
// (data-parallel attention), then
//
//   splits   : one AllGather of each rank's row counts per destination (an [N, N] matrix, so
//              every rank knows what it will receive: DeepEP's "notify" step);
//   dispatch : ONE AllToAll of uneven splits: each (token, chosen expert) row goes to the rank
//              holding that expert (ExpertPlacement), as [x (H floats) | local slot | weight];
//   experts  : the received rows through kernels::cpu::FusedMoe (k = 1, the rank's own experts),
//              each row scaled by its routing weight;
//   combine  : ONE AllToAll back (the inverse splits, H floats a row), and each token sums its
//              k returned rows.
//
// Communication apart from expert compute, as vLLM's FusedMoEPrepareAndFinalize pairs with its
// experts: this class owns the two halves around the one expert kernel. A rank with no tokens
// (T = 0: an empty batch) still takes part in all three collectives and computes the rows others
// send it, so every rank calls Run once per MoE layer, in the same order.
//
// Wire format: floats; the local slot and the counts are integers carried exactly as floats
// (below 2^24: refused above).
//
// Thread safety: Run() reuses scratch buffers; one caller at a time.
#ifndef TANDEM_RUNTIME_CPU_MOE_ALL_TO_ALL_H_
#define TANDEM_RUNTIME_CPU_MOE_ALL_TO_ALL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/process_group.h"
#include "kernels/moe/moe.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/model/expert_placement.h"

namespace tandem::runtime {

class MoeAllToAll {
 public:
  // `group` (its size = placement's ranks; outliving this) carries the three collectives.
  explicit MoeAllToAll(comm::ProcessGroup* group) : group_(group) {}

  // out[T, H] = sum over j < k of routing.weights[t*k + j] * expert_{ids[t*k + j]}(x[t]), where
  // every expert runs on the rank `placement` names (`experts`: this rank's, stacked in
  // placement.experts_of(rank) order). x, out: [T, H]; T = routing.num_tokens may be 0.
  // out must not alias x. Errors: the group's (the group is then broken), INVALID_ARGUMENT for a
  // placement of another size or counts beyond 2^24.
  absl::Status Run(const kernels::MoeRouting& routing, const ExpertPlacement& placement,
                   const kernels::MoeExpertWeights& experts, const float* x, int64_t H, float* out,
                   kernels::ThreadPool* pool);

  // Rows this rank sent to / received from each rank in the last Run ([N]; tests, metrics).
  const std::vector<int64_t>& last_sent_rows() const { return send_rows_; }
  const std::vector<int64_t>& last_received_rows() const { return recv_rows_; }

 private:
  comm::ProcessGroup* const group_;
  // [E] -> the expert's slot in its rank's stacked weights (placement.experts_of order).
  std::vector<int32_t> slot_in_owner_;
  // Per Run: rows per destination / source, the (token) of each sent row in send order.
  std::vector<int64_t> send_rows_, recv_rows_, offsets_, send_counts_, recv_counts_;
  std::vector<int32_t> sent_token_;
  std::vector<float> counts_, all_counts_, send_, recv_, expert_x_, expert_out_, back_;
  kernels::MoeRouting received_;
  kernels::MoeScratch scratch_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_MOE_ALL_TO_ALL_H_
