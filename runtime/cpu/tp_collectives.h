// The pieces the CPU decoders share (LlamaModel, MlaModel): the step check, the DCP shard check,
// the vocab-parallel embedding and logits (local lm_head rows + all-gather) and the DCP attention
// exchange (one all-to-all of (out, lse) + LSE merge). One owner, so the GQA and MLA paths cannot
// drift apart.
//
// Thread safety: functions over caller-owned buffers; a TpScratch belongs to one model.
#ifndef TANDEM_RUNTIME_CPU_TP_COLLECTIVES_H_
#define TANDEM_RUNTIME_CPU_TP_COLLECTIVES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "comm/process_group.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::runtime {

// Scratch of the collectives below, grown on demand and reused across steps.
struct TpScratch {
  std::vector<float> last, local_logits, gathered, send, recv, merged;
};

// Rows of the vocabulary each rank of `group` holds (ceil(vocab / n); the whole one alone).
inline int64_t VocabRows(int64_t vocab_size, const comm::ProcessGroup* group) {
  const int64_t n = group == nullptr ? 1 : group->size();
  return (vocab_size + n - 1) / n;
}

// The checks both decoders make of a step: T > 0 tokens, as many positions and slots, every
// logit row in [0, T). INVALID_ARGUMENT naming the first violation.
absl::Status CheckForwardShape(int64_t T, int64_t num_positions, int64_t num_slots,
                               absl::Span<const int64_t> logit_rows);

// OK when `dcp` (size > 1) fits `group` (nullable) and `num_heads` local attention heads: a valid
// shard, dcp.size dividing the group's size and the heads, dcp.rank the group rank's KV shard
// (kernels::DcpShardOfTpRank). INVALID_ARGUMENT naming the numbers otherwise; OK for size 1.
absl::Status CheckDcpShard(const kernels::DcpShard& dcp, const comm::ProcessGroup* group,
                           int64_t num_heads);

// residual [T, H] = the embedding rows of `token_ids`: with a group, this rank's `vocab_rows` rows
// of `embed` (ids from vocab_begin) summed over the group; without, embed's V rows.
absl::Status TpEmbedding(const int32_t* token_ids, int64_t T, const float* embed, int64_t V,
                         int64_t H, int64_t vocab_begin, int64_t vocab_rows,
                         comm::ProcessGroup* group, float* residual);

// logits [R, V] of hidden's rows `logit_rows` (hidden [T, H]) through `lm_head`: with a group,
// this rank's `vocab_rows` rows (ids from rank * vocab_rows), all-gathered (every rank takes
// part, also with R = 0) and the padding past V dropped; without, lm_head's V rows. `pool`
// nullable. With `lm_head_fp8` (an FP8 lm_head of those rows: ModelWeights::lm_head_fp8), the
// product is cpu::Fp8Linear's (its activation scheme) and `lm_head` is unused.
absl::Status VocabParallelLogits(const float* hidden, int64_t H,
                                 absl::Span<const int64_t> logit_rows, const float* lm_head,
                                 int64_t V, int64_t vocab_rows, comm::ProcessGroup* group,
                                 kernels::ThreadPool* pool, TpScratch* scratch,
                                 std::vector<float>* logits,
                                 const kernels::Fp8WeightView* lm_head_fp8 = nullptr);

// DCP: `attn` [T, num_heads, head_dim] and `lse` [T, num_heads] (the slice's heads over this
// shard's keys) -> scratch->merged [T, num_heads / dcp.size, head_dim] (this rank's heads over
// every shard's keys), through one all-to-all of the whole group (zero counts outside the slice,
// whose ranks are contiguous: [rank - dcp.rank, + dcp.size)).
absl::Status DcpExchangeAttention(const float* attn, const float* lse, int64_t T, int64_t num_heads,
                                  int64_t head_dim, const kernels::DcpShard& dcp,
                                  comm::ProcessGroup* group, TpScratch* scratch);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_TP_COLLECTIVES_H_
