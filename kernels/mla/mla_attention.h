// Multi-head latent attention (DeepSeek-V2/V3 MLA) over a paged latent KV cache, CPU reference.
//
// Per token the cache keeps ONE latent row of kv_lora_rank + qk_rope_head_dim values (plane 0 of
// a KvCacheLayout with num_planes = 1, num_kv_heads = 1, head_dim = LatentDim()):
//   latent = [c_kv (kv_lora_rank, after kv_a_layernorm) | k_pe (qk_rope_head_dim, RoPE'd)]
// kv_b_proj ([Hq * (Dn + Dv), L], torch Linear layout) turns c_kv into every head's keys and
// values: rows h*(Dn+Dv) .. +Dn are W_UK of head h, the next Dv rows W_UV.
//   score(h, j) = scale * (q_nope_h . (W_UK_h c_kv_j) + q_pe_h . k_pe_j)
//   out_h       = sum_j softmax_j(score) * (W_UV_h c_kv_j)
// Two exact rearrangements of that math (equal up to fp32 rounding; the tests hold both to an
// fp64 reference):
//   * absorbed (decode, FlashMLA's form): q_lat_h = W_UK_h^T q_nope_h once per query, attention
//     of every head over the shared latent rows (keys 576 wide, values the 512-wide c_kv for
//     DeepSeek-V3), then out_h = W_UV_h o_lat_h. Reads each latent row once per query token.
//   * unabsorbed (prefill): up-project the sequence's latent prefix into per-head k_nope / v once,
//     then ordinary causal attention; cheaper when many query tokens share the prefix.
// MlaPagedAttention picks per sequence: absorbed for q_len <= kMlaAbsorbMaxQueryLen, else
// unabsorbed.
//
// Thread safety: pure functions over caller-owned buffers.
#ifndef TANDEM_KERNELS_MLA_MLA_ATTENTION_H_
#define TANDEM_KERNELS_MLA_MLA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels {

struct MlaDims {
  int64_t num_heads = 0;         // Hq
  int64_t qk_nope_head_dim = 0;  // Dn
  int64_t qk_rope_head_dim = 0;  // Dr (even)
  int64_t kv_lora_rank = 0;      // L
  int64_t v_head_dim = 0;        // Dv

  int64_t QkHeadDim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t LatentDim() const { return kv_lora_rank + qk_rope_head_dim; }
  // INVALID_ARGUMENT naming the field unless every size is positive and Dr even.
  absl::Status Validate() const;
};

// Query lengths up to this run absorbed (decode and short speculative verification).
inline constexpr int64_t kMlaAbsorbMaxQueryLen = 4;

// How MlaPagedAttention computes a sequence.
enum class MlaMode { kAuto, kAbsorbed, kUnabsorbed };

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {

// RoPE on the decoupled part of rows: for t in [0, num_tokens), r in [0, rows_per_token), the
// rope_dim values at x + (t * rows_per_token + r) * row_stride + offset are rotated by angle
// positions[t] * inv_freq[i], cos/sin multiplied by `attention_factor` (YaRN's; 1 otherwise).
// interleave: pairs (x[2i], x[2i+1]) rotate together (DeepSeek-V2, V3 with rope_interleave; the
// output stays in pair order, a fixed permutation of transformers' V3 output, which leaves every
// q_pe . k_pe unchanged); else rotate-half (x[i], x[i + rope_dim/2]).
struct MlaRopeRows {
  float* x = nullptr;
  int64_t rows_per_token = 1;
  int64_t row_stride = 0;
  int64_t offset = 0;
};
void ApplyMlaRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                  int64_t rope_dim, float attention_factor, bool interleave, MlaRopeRows rows);

// Writes latent rows ([num_tokens, LatentDim()]) into plane 0 of `layer` at slot_mapping (-1:
// skipped). INVALID_ARGUMENT unless the cache has num_planes 1, one head of LatentDim() values,
// and every slot is in range.
absl::Status WriteLatentCache(const float* latent, const int64_t* slot_mapping, int64_t num_tokens,
                              int64_t layer, KvCacheView cache);

// MLA attention of a batch over the paged latent cache (the new tokens' latents already written).
// q: [T, Hq, Dn + Dr] (q_pe rotated); kv_b_proj: [Hq * (Dn + Dv), L]; out: [T, Hq, Dv];
// lse (nullable): [T, Hq], natural-log sum of exp of the scaled scores. Query token i of sequence
// s (q_len = query_start_loc[s+1] - query_start_loc[s]) sits at position seq_lens[s] - q_len + i
// and sees latents 0..that position. `scale` multiplies q.k (DeepSeek: (Dn + Dr)^-0.5 times
// YaRN's mscale^2). INVALID_ARGUMENT for a cache that is not the latent layout of `dims`, bad
// batch metadata, or a non-positive scale.
// Decode context parallelism (`dcp.size` > 1): the cache holds only shard dcp.rank of every
// sequence's latents, at local indices 0..batch.local_seq_lens[s]-1 (dcp_shard.h), while
// seq_lens and query positions stay global; each query attends to the shard's latents at global
// positions up to its own, so merging every shard's (out, lse) with MergeAttnStatesN gives the
// unsharded result. A query that sees none of the shard's latents gets out 0, lse -inf.
absl::Status MlaPagedAttention(const float* q, const float* kv_b_proj, const MlaDims& dims,
                               KvCacheView cache, int64_t layer, const AttentionBatch& batch,
                               float scale, MlaMode mode, float* out, float* lse, ThreadPool* pool,
                               DcpShard dcp = {});

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_MLA_MLA_ATTENTION_H_
