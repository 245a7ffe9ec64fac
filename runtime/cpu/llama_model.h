// The Llama-family decoder on the CPU backend: Llama, Qwen2, Mistral, Qwen3 and the mixtures of
// experts Mixtral, Qwen2-MoE, Qwen3-MoE (runtime/model/model_config.h).
//
// Per layer: RMSNorm (fused with the residual add) -> fused QKV projection (+bias) -> [Qwen3:
// per-head q/k RMSNorm] -> RoPE -> KV write into the paged pool -> paged attention -> o_proj ->
// RMSNorm -> MLP: gate_up -> SiLU*up -> down_proj, or on a mixture-of-experts layer the router
// -> softmax top-k -> each expert's SwiGLU on its tokens -> weighted combine (kernels/moe), plus
// Qwen2-MoE's sigmoid-gated shared expert. Under tensor parallelism every rank routes the same
// (replicated) tokens with the replicated router and runs its slice of every expert; the one
// all-reduce after the MLP sums the slices, as for a dense MLP. Every op comes from kernels/ with
// the signature the CUDA backend mirrors.
//
// Thread safety: Forward() is not reentrant (it reuses scratch buffers); the engine calls it
// from its step loop only. Weights are immutable after Create().
#ifndef TANDEM_RUNTIME_CPU_LLAMA_MODEL_H_
#define TANDEM_RUNTIME_CPU_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "comm/process_group.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/cpu/moe_mlp.h"
#include "runtime/cpu/tp_collectives.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

// One step's flattened batch (T = total new tokens of all sequences).
struct ForwardInput {
  absl::Span<const int32_t> token_ids;     // [T]
  absl::Span<const int64_t> positions;     // [T]
  absl::Span<const int64_t> slot_mapping;  // [T]; -1 = do not write
  kernels::AttentionBatch attention;       // query_start_loc / seq_lens / block tables
  // Multi-token prediction (mtp_model.h; MlaModel only, empty / null elsewhere):
  absl::Span<const float> input_hidden;      // [T, hidden]: the MTP's previous hidden states
  absl::Span<const float> input_embeds;      // [T, hidden]: replaces the embedding lookup
  std::vector<float>* hidden_out = nullptr;  // [T, hidden] out: the last hidden states, the
  bool hidden_out_before_norm = false;       // final norm's output, or (true) its input
};

class LlamaModel {
 public:
  // Takes ownership of the weights. `pool` (nullable) must outlive the model.
  // Tensor parallelism: with a `group` of size > 1 this model is rank group->rank() of it;
  // `config` is the rank's (LocalModelConfig: its heads and MLP width, the full vocabulary) and
  // `weights` its shard (runtime/model/tensor_parallel.h). The group (outliving the model) sums
  // the row-parallel o_proj / down_proj outputs and the vocab-parallel embedding, and gathers
  // the vocab-parallel logits, so every rank's Forward returns the full logits.
  //
  // Decode context parallelism (`dcp.size` > 1, dividing the group; tensor_parallel.h): the
  // group's ranks t*KVP .. t*KVP+KVP-1 hold KV shards 0..KVP-1 of attention slice t (`config` is
  // the slice's heads); each runs paged attention over its shard (global positions; the caller's
  // ForwardInput writes only the tokens the shard holds and gives local_seq_lens), then ONE
  // all-to-all per layer among the slice's ranks exchanges (out, lse) packed in one buffer
  // (kernels/attention/dcp_exchange.h), each rank merges its Hq/N heads by LSE and runs its
  // o_proj rows (row-parallel over all N ranks, all-reduced). `dcp.rank` must be
  // group->rank() % dcp.size.
  //
  // fp8_kv (--kv_cache_dtype=fp8): Forward's cache.data holds e4m3 codes (KvLayout's elements, one
  // byte each; kernels::Fp8KvCacheView), layer l's K and V each with one scale: the checkpoint's
  // calibrated LayerWeights::kv_k_scale / kv_v_scale where it has them, else kFp8KvTensorScale
  // (runtime/engine/kv_layout.h), as the CUDA backend stores them.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      const ModelConfig& config, ModelWeights weights, kernels::ThreadPool* pool,
      comm::ProcessGroup* group = nullptr, kernels::DcpShard dcp = {}, bool fp8_kv = false);

  // The KV pool layout this model needs for `num_blocks` blocks of `block_size` tokens.
  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const;

  // Runs the decoder over `input`, writing new K/V into `cache`, and computes logits for the
  // token rows listed in `logit_rows` (indices into [0, T)).
  // logits: resized to [logit_rows.size(), vocab].
  absl::Status Forward(const ForwardInput& input, kernels::KvCacheView cache,
                       absl::Span<const int64_t> logit_rows, std::vector<float>* logits);

  const ModelConfig& config() const { return config_; }
  // Tokens routed to each expert so far (MoeMlp::expert_tokens; empty for dense models).
  const std::vector<uint64_t>& moe_expert_tokens() const { return moe_.expert_tokens(); }
  const kernels::DcpShard& dcp() const { return dcp_; }

 private:
  LlamaModel(const ModelConfig& config, ModelWeights weights, std::vector<float> inv_freq,
             kernels::ThreadPool* pool, comm::ProcessGroup* group, kernels::DcpShard dcp,
             bool fp8_kv);
  // Writes layer l's new K / V (k_, v_) into `cache` and attends over it into attn_ (and lse_).
  absl::Status Attend(const ForwardInput& input, kernels::KvCacheView cache, int64_t l,
                      const kernels::AttentionParams& params, int64_t Hq);
  // Layer l's MLP (dense or mixture of experts) on hidden_ ([T, H], normalized) into hidden_
  // (this rank's partial sum).
  absl::Status Mlp(int64_t l, int64_t T);
  absl::Status SparseMlp(const LayerWeights& w, int64_t T);

  const ModelConfig config_;
  const ModelWeights weights_;
  const std::vector<float> inv_freq_;  // [head_dim / 2], shared by all layers
  kernels::ThreadPool* const pool_;
  comm::ProcessGroup* const group_;  // null: no tensor parallelism
  const int64_t vocab_begin_;        // this rank's embedding / lm_head rows
  const int64_t vocab_rows_;
  const kernels::DcpShard dcp_;
  const bool fp8_kv_;
  // Scratch, grown on demand and reused across steps.
  std::vector<float> hidden_, residual_, qkv_, q_, k_, v_, attn_, gate_up_, act_, lse_, moe_out_;
  TpScratch tp_;  // vocab-parallel logits, DCP exchange (tp_collectives.h)
  MoeMlp moe_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_LLAMA_MODEL_H_
