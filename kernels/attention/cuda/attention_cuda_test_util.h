// The CUDA attention tests' harness (testonly): a PagedCase (attention_test_util.h) on the
// device, its plan bounds, and the kernel's output read back, shared by paged_attention_cuda_test,
// paged_prefill_cuda_test and dcp_cuda_test so each keeps only what it checks.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_ATTENTION_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_ATTENTION_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda_test {

// Rounds q, the pool and the reference's K/V copies to T (idempotent), so references computed
// from the case see exactly the kernel's inputs.
template <typename T>
void RoundCase(attention_test::PagedCase& c) {
  RoundTo<T>(c.q);
  RoundTo<T>(c.pool);
  for (auto& k : c.k) RoundTo<T>(k);
  for (auto& v : c.v) RoundTo<T>(v);
}

// A case's batch on the device: query_start_loc, seq_lens, block tables and, for a DCP shard
// case, local_seq_lens; `batch` points at them.
struct DeviceBatch {
  explicit DeviceBatch(const attention_test::PagedCase& c)
      : query_start_loc(c.query_start_loc),
        seq_lens(c.seq_lens),
        block_tables(c.block_tables),
        local_seq_lens(c.local_seq_lens.empty() ? std::vector<int32_t>(1, 0) : c.local_seq_lens),
        batch(c.Batch()) {
    batch.query_start_loc = query_start_loc.get();
    batch.seq_lens = seq_lens.get();
    batch.block_tables = block_tables.get();
    batch.local_seq_lens = c.local_seq_lens.empty() ? nullptr : local_seq_lens.get();
  }
  DeviceBuffer<int32_t> query_start_loc, seq_lens, block_tables, local_seq_lens;
  AttentionBatch batch;
};

// The plan bounds of a case: sequences, tokens, the longest query, the most keys a request
// reads (a DCP shard case: this rank's keys, which size the splits), head counts, head_dim.
// `PlanInput`: cuda::PagedAttentionPlanInput or cuda::PagedPrefillPlanInput.
template <typename PlanInput>
void SetPlanShape(const attention_test::PagedCase& c, PlanInput& in) {
  in.num_seqs = static_cast<int64_t>(c.seqs.size());
  in.num_tokens = c.num_tokens;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    in.max_q_len = std::max(in.max_q_len, c.seqs[s].q_len);
    const int64_t keys = c.local_seq_lens.empty() ? c.seqs[s].seq_len : c.local_seq_lens[s];
    in.max_seq_len = std::max(in.max_seq_len, keys);
  }
  in.num_q_heads = c.options.num_q_heads;
  in.num_kv_heads = c.layout.num_kv_heads;
  in.head_dim = c.options.head_dim;
}

// A kernel's out [num_tokens, num_q_heads, head_dim] and lse [num_tokens, num_q_heads] on the
// host, as float (the device buffers may be padded to one element).
struct AttentionOutput {
  std::vector<float> out;
  std::vector<float> lse;
};
template <typename T>
AttentionOutput ReadBack(const attention_test::PagedCase& c, const DeviceBuffer<T>& out,
                         const DeviceBuffer<float>& lse) {
  const int64_t rows = c.num_tokens * c.options.num_q_heads;
  AttentionOutput r{ToFloat(out.ToHost()), lse.ToHost()};
  r.out.resize(rows * c.options.head_dim);
  r.lse.resize(rows);
  return r;
}

}  // namespace tandem::kernels::cuda_test

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_ATTENTION_CUDA_TEST_UTIL_H_
