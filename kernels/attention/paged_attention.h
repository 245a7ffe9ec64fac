// Paged attention over the block-major KV pool (kv_cache_layout.h): one call covers decode
// (q_len = 1), speculative verification (q_len > 1 over a long context), prefill (no prefix) and
// extend (paged prefix + new tokens) for a whole batch, and returns the log-sum-exp of each
// (token, head) so partial results can be merged (merge_attn_states.h).
//
// Thread safety: reads q and the pool, writes out and lse; no shared state. The pool's K/V must
// not be written concurrently (ReshapeAndCache for this step runs before, not during).
#ifndef TANDEM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
#define TANDEM_KERNELS_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels {

// Per-step batch metadata, built once on the host and reused by every layer (FlashInfer
// plan/run style). Non-owning.
struct AttentionBatch {
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], cu_seqlens of the new (query)
                                             // tokens; query_start_loc[0] = 0
  const int32_t* seq_lens = nullptr;         // [num_seqs], total context of each request INCLUDING
                                             // its new tokens
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq], logical -> physical
                                             // block ids; entries not needed may hold anything
  int64_t num_seqs = 0;
  int64_t max_blocks_per_seq = 0;
  // Decode context parallelism only (AttentionParams::dcp_size > 1; ignored otherwise):
  // [num_seqs], the number of the request's tokens this rank holds, DcpLocalCount(seq_lens[s]).
  // The pool and block_tables then hold those tokens at LOCAL indices 0..local_seq_lens[s]-1,
  // while seq_lens (and so every query position) stay GLOBAL.
  const int32_t* local_seq_lens = nullptr;
};

struct AttentionParams {
  float scale = 0;           // multiplies q.k; must be finite and > 0 (usually 1/sqrt(head_dim))
  int64_t window_left = -1;  // >= 0: query at p sees keys [p - window_left, p]; -1: no window
  float softcap = 0;         // > 0: s = softcap * tanh(s / softcap) on scaled scores; 0: off
  // Decode context parallelism (dcp_shard.h): dcp_size > 1 means the pool holds only rank
  // dcp_rank's KV shard, tokens dealt out in units of dcp_interleave. Scalars rather than a
  // DcpShard member, so positional and designated initializers of the fields above stay valid
  // under -Wmissing-field-initializers.
  int64_t dcp_size = 1;
  int64_t dcp_rank = 0;
  int64_t dcp_interleave = 1;

  constexpr DcpShard Dcp() const { return {dcp_size, dcp_rank, dcp_interleave}; }
};

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {

// Sequence s has q_len = query_start_loc[s+1] - query_start_loc[s] new tokens; its query token j
// sits at position p = seq_lens[s] - q_len + j and attends to context positions [0, p] (causal
// among the new tokens; their K/V are already in the cache via ReshapeAndCache), narrowed to
// [p - window_left, p] by a sliding window. GQA/MQA: query head h uses kv head
// h / (num_q_heads / num_kv_heads).
//
// q: [num_tokens, num_q_heads, head_dim]; out: [num_tokens, num_q_heads, head_dim];
// lse: [num_tokens, num_q_heads], natural-log sum-exp of the (soft-capped) scaled scores, or null.
// num_tokens = query_start_loc[num_seqs]; head_dim and num_kv_heads come from cache.layout.
// A query with no visible keys gets out = 0 and lse = -inf. NaN in q or in a visible K/V row
// gives NaN out (and lse, for K) for the affected (token, head), never a silent 0.
//
// Decode context parallelism (params.dcp_size > 1): the pool holds this rank's shard only, local
// key j being global position g(j) (dcp_shard.h); query positions stay global. Local key j is
// visible to the query at p iff g(j) <= p (and g(j) >= p - window_left), so the result is
// attention over the shard's keys alone, a partial to merge with the other shards' by LSE
// (dcp_exchange.h). A shard holding no visible key gives out = 0, lse = -inf. Any q_len works
// (decode, speculative verification, a prefill chunk). dcp_size 1 is the ordinary path.
//
// Numerics: online softmax over chunks of keys, fp32 accumulation. Work is split into
// (sequence, kv head, query tile) items, each computed by one thread the same way whatever the
// pool, so results are bitwise identical for any thread count. Each K/V row is loaded once per
// item and used by every query head of the kv head's GQA group.
//
// INVALID_ARGUMENT (out and lse untouched) on: invalid layout or null cache.data; layer out of
// range; num_q_heads not a positive multiple of num_kv_heads; scale not finite and > 0; softcap
// negative or not finite; window_left < -1; num_seqs or max_blocks_per_seq negative;
// query_start_loc[0] != 0 or decreasing; seq_len < 0, q_len > seq_len, or seq_len beyond
// max_blocks_per_seq * block_size; a block-table entry needed by some query outside
// [0, num_blocks); null pointers where data is needed. DCP: !DcpShardValid(params.Dcp());
// local_seq_lens null, or local_seq_lens[s] != DcpLocalCount(seq_lens[s]) (the block-table bounds
// then use the local length).
absl::Status PagedAttention(const float* q, int64_t num_q_heads, KvCacheView cache, int64_t layer,
                            const AttentionBatch& batch, const AttentionParams& params, float* out,
                            float* lse, ThreadPool* pool);

// The same over an FP8 K / V pool (kv_cache_layout.h): each K / V row read as its codes times
// cache.k_scale / cache.v_scale (fp32 products), then the arithmetic above, so the result is
// bitwise that of PagedAttention over an f32 pool holding those products. Also INVALID_ARGUMENT
// for a scale that is not finite and > 0.
absl::Status PagedAttention(const float* q, int64_t num_q_heads, Fp8KvCacheView cache,
                            int64_t layer, const AttentionBatch& batch,
                            const AttentionParams& params, float* out, float* lse,
                            ThreadPool* pool);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
