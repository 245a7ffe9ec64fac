// One mixture-of-experts MLP layer on the CPU backend, shared by the decoders (LlamaModel for
// Mixtral / Qwen2-MoE / Qwen3-MoE, MlaModel for DeepSeek-V2/V3): the router, the routing the
// config names (softmax top-k, or DeepSeek's grouped / bias-corrected top-k; kernels/moe), the
// routed experts on their tokens, and the shared expert(s), gated by a sigmoid for Qwen2-MoE.
// Under expert parallelism over the TP ranks (config.expert_placement, tensor_parallel.h) every
// rank routes the replicated tokens alike, runs only the rows routed to its own (whole) experts
// and leaves the other rows to their ranks: the model's all-reduce after the MLP sums the parts.
// Under data-parallel attention (config.dp_attention, UseAllToAll) every rank routes ITS OWN
// tokens and the routed rows travel to their experts' ranks and back (moe_all_to_all.h); the
// shared expert(s), replicated, run locally.
//
// Thread safety: Run() reuses scratch buffers; one caller at a time (expert_tokens() too).
#ifndef TANDEM_RUNTIME_CPU_MOE_MLP_H_
#define TANDEM_RUNTIME_CPU_MOE_MLP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "comm/process_group.h"
#include "kernels/moe/moe.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/cpu/moe_all_to_all.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

class MoeMlp {
 public:
  // out[T, H] = the layer's MLP of x[T, H] (normalized hidden states; every rank passes the
  // same x), from this rank's slice of every expert: under tensor parallelism the ranks' outputs
  // sum to the layer's. `config` is the rank's (LocalModelConfig). out must not alias x.
  // Under expert parallelism the rank's experts only (whole), so again the ranks' outputs sum.
  // With UseAllToAll: x is this rank's own tokens (T may be 0) and out their whole MLP output.
  absl::Status Run(const ModelConfig& config, const LayerWeights& w, const float* x, int64_t T,
                   float* out, kernels::ThreadPool* pool);

  // Data-parallel attention: the routed rows go to their experts' ranks over `group` (its size
  // the placement's; outliving this). Call once, before the first Run.
  void UseAllToAll(comm::ProcessGroup* group) {
    all_to_all_ = std::make_unique<MoeAllToAll>(group);
  }
  bool uses_all_to_all() const { return all_to_all_ != nullptr; }
  // Data-parallel attention, a step without tokens on this rank: every MoE layer's Run with T = 0
  // (its collectives, and the experts' work on the rows other ranks send).
  absl::Status RunIdle(const ModelConfig& config, const ModelWeights& weights,
                       kernels::ThreadPool* pool);

  // Tokens routed to each expert ([num_experts], global ids), summed over every Run (all MoE
  // layers, every step): one count per (token, chosen expert). Every rank of a group routes
  // alike, so any rank's counts are the group's. Empty before the first Run.
  const std::vector<uint64_t>& expert_tokens() const { return expert_tokens_; }

 private:
  absl::Status Route(const ModelConfig& config, const LayerWeights& w, int64_t T);
  // Expert parallelism: out[T, H] = this rank's experts' part of the routed sum.
  absl::Status RunOwnedExperts(const ModelConfig& config, const kernels::MoeExpertWeights& experts,
                               const float* x, int64_t T, float* out, kernels::ThreadPool* pool);

  std::vector<float> router_logits_, gate_up_, act_, shared_;
  kernels::MoeRouting routing_;
  kernels::MoeScratch scratch_;
  // Expert parallelism: [E] -> this rank's slot or -1; the owned rows as a routing of their own
  // (k = 1, local slot ids), their tokens, inputs and outputs.
  std::vector<int32_t> local_slots_;
  kernels::MoeRouting owned_;
  std::vector<int32_t> owned_token_;
  std::vector<float> owned_x_, owned_out_;
  std::vector<uint64_t> expert_tokens_;
  std::unique_ptr<MoeAllToAll> all_to_all_;  // data-parallel attention only
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_MOE_MLP_H_
