#include "runtime/cpu/tp_collectives.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/dcp_exchange.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/embedding.h"

namespace tandem::runtime {

absl::Status CheckForwardShape(int64_t T, int64_t num_positions, int64_t num_slots,
                               absl::Span<const int64_t> logit_rows) {
  if (T == 0) return absl::InvalidArgumentError("Forward: empty batch");
  if (num_positions != T || num_slots != T) {
    return absl::InvalidArgumentError("Forward: token_ids, positions, slot_mapping sizes differ");
  }
  for (int64_t row : logit_rows) {
    if (row < 0 || row >= T) {
      return absl::InvalidArgumentError(
          absl::StrCat("Forward: logit row ", row, " not in [0, ", T, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDcpShard(const kernels::DcpShard& dcp, const comm::ProcessGroup* group,
                           int64_t num_heads) {
  if (dcp.size <= 1) return absl::OkStatus();
  const int64_t n = group == nullptr ? 1 : group->size();
  if (!kernels::DcpShardValid(dcp) || group == nullptr || n % dcp.size != 0 ||
      kernels::DcpShardOfTpRank(group->rank(), dcp.size) != dcp.rank || num_heads % dcp.size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DCP size ", dcp.size, " rank ", dcp.rank, " interleave ", dcp.interleave,
                     " does not fit a group of ", n, " ranks with ", num_heads,
                     " local attention heads (dcp must divide both; rank = group rank % dcp)"));
  }
  return absl::OkStatus();
}

absl::Status TpEmbedding(const int32_t* token_ids, int64_t T, const float* embed, int64_t V,
                         int64_t H, int64_t vocab_begin, int64_t vocab_rows,
                         comm::ProcessGroup* group, float* residual) {
  if (group == nullptr) return kernels::cpu::Embedding(token_ids, T, embed, V, H, residual);
  RETURN_IF_ERROR(kernels::cpu::VocabShardEmbedding(token_ids, T, embed, vocab_begin, vocab_rows, V,
                                                    H, residual));
  return group->AllReduceSum(absl::MakeSpan(residual, T * H));
}

absl::Status VocabParallelLogits(const float* hidden, int64_t H,
                                 absl::Span<const int64_t> logit_rows, const float* lm_head,
                                 int64_t V, int64_t vocab_rows, comm::ProcessGroup* group,
                                 kernels::ThreadPool* pool, TpScratch* s,
                                 std::vector<float>* logits,
                                 const kernels::Fp8WeightView* lm_head_fp8) {
  // Logits only where a token is sampled (or prompt logits are captured).
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  s->last.resize(R * H);
  for (int64_t r = 0; r < R; ++r) {
    std::copy_n(hidden + logit_rows[r] * H, H, s->last.data() + r * H);
  }
  const float* last = s->last.data();
  logits->resize(R * V);
  // out [R, rows] = last . lm_head's first `rows` rows^T
  const auto head = [&](int64_t rows, float* out) -> absl::Status {
    if (R == 0) return absl::OkStatus();
    if (lm_head_fp8 == nullptr) {
      kernels::cpu::Linear(last, lm_head, nullptr, R, rows, H, out, pool);
      return absl::OkStatus();
    }
    if (lm_head_fp8->grid.cols != H || lm_head_fp8->grid.rows != rows) {
      return absl::InvalidArgumentError(absl::StrCat("FP8 lm_head [", lm_head_fp8->grid.rows, ", ",
                                                     lm_head_fp8->grid.cols, "], expected [", rows,
                                                     ", ", H, "]"));
    }
    return kernels::cpu::Fp8Linear(last, *lm_head_fp8, nullptr, R, out, pool);
  };
  if (group == nullptr) return head(V, logits->data());
  // Every rank takes part even with R = 0 rows: the gather is collective.
  const int64_t P = vocab_rows, n = group->size();
  s->local_logits.resize(R * P);
  s->gathered.resize(n * R * P);
  // (the shape check cannot fail on one rank only: the models check their weights at Create)
  RETURN_IF_ERROR(head(P, s->local_logits.data()));
  RETURN_IF_ERROR(group->AllGather(s->local_logits, absl::MakeSpan(s->gathered)));
  // gathered is [rank][row][P]; logits is [row][V] (the padding past V dropped).
  for (int64_t r = 0; r < n; ++r) {
    const int64_t cols = std::min(P, V - r * P);
    if (cols <= 0) continue;
    for (int64_t row = 0; row < R; ++row) {
      std::copy_n(s->gathered.data() + (r * R + row) * P, cols, logits->data() + row * V + r * P);
    }
  }
  return absl::OkStatus();
}

absl::Status DcpExchangeAttention(const float* attn, const float* lse, int64_t T, int64_t num_heads,
                                  int64_t head_dim, const kernels::DcpShard& dcp,
                                  comm::ProcessGroup* group, TpScratch* s) {
  kernels::DcpExchangeLayout layout;
  layout.num_tokens = T;
  layout.num_heads = num_heads;
  layout.head_dim = head_dim;
  layout.dcp_size = dcp.size;
  layout.elem_bytes = sizeof(float);
  RETURN_IF_ERROR(layout.Validate());
  // Regions are multiples of 16 bytes, so of floats; vectors of float are 16-byte aligned.
  const int64_t region = layout.RegionBytes() / static_cast<int64_t>(sizeof(float));
  s->send.resize(dcp.size * region);
  s->recv.resize(dcp.size * region);
  s->merged.resize(T * layout.HeadsPerRank() * head_dim);
  RETURN_IF_ERROR(kernels::cpu::DcpPackForExchange(attn, lse, layout, s->send.data()));
  // The slice's ranks are contiguous in the group: [first, first + dcp.size).
  std::vector<int64_t> counts(group->size(), 0);
  const int first = group->rank() - static_cast<int>(dcp.rank);
  for (int64_t k = 0; k < dcp.size; ++k) counts[first + k] = region;
  RETURN_IF_ERROR(group->AllToAll(s->send, counts, absl::MakeSpan(s->recv), counts));
  return kernels::cpu::DcpMergeReceived(s->recv.data(), layout, s->merged.data(), nullptr);
}

}  // namespace tandem::runtime
