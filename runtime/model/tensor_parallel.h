// Tensor parallelism's arithmetic: which heads, MLP columns and vocabulary rows one rank of a
// `--tp=N` group holds (Megatron-style, as vLLM splits Llama):
//   * q/k/v projections column-parallel by heads: rank r has query heads [r*Hq/N, (r+1)*Hq/N)
//     and KV heads [r*Hkv/N, ...) when N divides Hkv; when Hkv < N (N a multiple of Hkv) each
//     KV head is replicated on N/Hkv ranks: rank r keeps KV head r / (N/Hkv), the one its query
//     heads attend with;
//   * o_proj and down_proj row-parallel (their input columns split; partial sums all-reduced;
//     their biases added once, by rank 0);
//   * gate/up column-parallel by intermediate rows; mixture-of-experts layers the same way per
//     expert (each rank a slice of every expert's and the shared expert's intermediate rows,
//     the down projections row-parallel; router and shared_expert_gate replicated);
//   * embedding and lm_head vocab-parallel: rank r holds rows [r*P, r*P + P) of the vocabulary,
//     P = ceil(vocab / N), the last partition zero-padded.
// Norm weights are replicated. One rule for sizes everywhere (vLLM's): a group has N ranks in
// all; decode context parallelism divides it: `--dcp=KVP` (KVP | N) makes rank r = t * KVP + k
// the k-th KV shard of attention slice t of TP_A = N / KVP slices:
//   * q/k/v by heads over TP_A (slice t: query heads [t*Hq/TP_A, ...), KV heads [t*Hkv/TP_A,
//     ...); TP_A must divide Hkv: no replicated KV heads with DCP);
//   * after the all-to-all each rank owns Hq/N of its slice's heads, so o_proj stays
//     row-parallel over all N ranks (rank r: heads [r*Hq/N, (r+1)*Hq/N)), and the MLP,
//     embedding and lm_head are split N ways as without DCP.
// Expert parallelism over the same ranks (`--tp=N --enable_expert_parallel`, vLLM's spelling):
// attention, dense MLPs, embedding and lm_head split as above; each mixture-of-experts layer's
// routed experts are placed whole on the N ranks by one expert -> rank table (ExpertPlacement;
// contiguous: rank r holds experts [r*E/N, (r+1)*E/N), so N must divide E); every rank routes
// the replicated tokens alike and runs its own experts on the rows routed to them, the shared
// expert(s) stay TP-sliced (every token goes through them: the slice splits their work evenly),
// and the row-parallel all-reduce after the MLP sums the ranks' parts: one all-reduce per MoE
// layer, no all-to-all.
// Wide expert parallelism (`--tp=N --enable_expert_parallel --dp_attention`, SGLang's and vLLM's
// DP attention + EP): the N ranks are N data-parallel attention ranks, each serving its own
// requests with the whole attention, dense MLPs, shared expert(s), embedding and lm_head
// (replicated: TpDims of the full model, every rank adding the row-parallel biases); only the
// routed experts are placed whole by the same ExpertPlacement. No head split, so nothing to
// all-reduce; each MoE layer dispatches its routed rows to the experts' ranks with one
// all-to-all and combines them with another (runtime/cpu/moe_all_to_all.h). Refused: without
// expert parallelism, with dcp > 1.
//
// All functions are thread-safe (no shared state).
#ifndef TANDEM_RUNTIME_MODEL_TENSOR_PARALLEL_H_
#define TANDEM_RUNTIME_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/expert_placement.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime {

// One rank's place in its tensor-parallel group.
struct TpShard {
  int rank = 0;
  int size = 1;
  int dcp = 1;  // KVP: KV shards per attention slice; divides size
  // Expert parallelism over the group's ranks; placement null: ExpertPlacement::Contiguous.
  bool expert_parallel = false;
  std::shared_ptr<const ExpertPlacement> expert_placement = nullptr;
  // Data-parallel attention (--dp_attention, with expert_parallel; dcp 1): every rank holds the
  // whole model but its experts (see the header comment, "Wide expert parallelism").
  bool dp_attention = false;
};

// What rank `shard.rank` holds, in units of the full model (see the header comment).
struct TpDims {
  TpShard shard;
  int64_t q_heads = 0;  // local query heads
  int64_t q_head_begin = 0;
  int64_t kv_heads = 0;  // local KV heads
  int64_t kv_head_begin = 0;
  bool kv_replicated = false;  // Hkv < N: each KV head lives on N / Hkv ranks
  int64_t o_heads = 0;         // heads of o_proj's input columns (q_heads / dcp)
  int64_t o_head_begin = 0;
  int64_t intermediate = 0;  // local MLP width
  int64_t intermediate_begin = 0;
  // Mixture of experts (config.IsMoe()): every rank holds the same slice of every expert's
  // intermediate rows (and of the shared expert's), like a dense MLP; the router is replicated.
  int64_t moe_intermediate = 0;
  int64_t moe_intermediate_begin = 0;
  int64_t shared_intermediate = 0;
  int64_t shared_intermediate_begin = 0;
  // Expert parallelism (shard.expert_parallel): the group's placement; the rank holds its experts
  // whole (moe_intermediate = the full width, begin 0). Null: every expert, sliced as above.
  std::shared_ptr<const ExpertPlacement> expert_placement = nullptr;
  int64_t vocab_rows = 0;  // local embedding / lm_head rows (the padded partition size)
  int64_t vocab_begin = 0;
  // Row-parallel biases (o_proj, down_proj) are added by one rank only.
  bool adds_row_parallel_bias = true;
};

// INVALID_ARGUMENT naming the numbers for a topology the model cannot be split into: a size
// or rank out of range, query heads or the intermediate size (or the experts' / shared expert's)
// not divisible by N, KV heads
// neither divisible by N nor dividing it; with dcp > 1: dcp not dividing N, TP_A = N / dcp not
// dividing the KV heads; with expert parallelism: a model without experts, N not dividing the
// experts (contiguous placement), a placement of another size; with dp_attention: no expert
// parallelism, or dcp > 1. `config` must pass
// ValidateModelConfig.
absl::StatusOr<TpDims> ComputeTpDims(const ModelConfig& config, TpShard shard);

// The config one rank computes with: its query heads, KV heads and intermediate size (with
// expert parallelism: the placement and its rank, ModelConfig::expert_placement). vocab_size
// stays the full vocabulary (token ids and sampling are global); the KV layout of the rank's
// pool follows from it (num_key_value_heads = its local KV heads).
absl::StatusOr<ModelConfig> LocalModelConfig(const ModelConfig& config, TpShard shard);

// One line for logs and startup messages, e.g. "tp=4: 1 of 4 query heads and 1 of 2 KV heads per
// rank (KV heads replicated on 2 ranks each), intermediate 32 of 128, vocab rows 128 of 512".
std::string DescribeTp(const ModelConfig& config, int tp, int dcp = 1);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_TENSOR_PARALLEL_H_
