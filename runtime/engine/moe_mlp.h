// One mixture-of-experts MLP layer on the CPU backend, shared by the decoders (LlamaModel for
// Mixtral / Qwen2-MoE / Qwen3-MoE, MlaModel for DeepSeek-V2/V3): the router, the routing the
// config names (softmax top-k, or DeepSeek's grouped / bias-corrected top-k; kernels/moe), the
// routed experts on their tokens, and the shared expert(s), gated by a sigmoid for Qwen2-MoE.
//
// Thread safety: Run() reuses scratch buffers; one caller at a time.
#ifndef TANDEM_RUNTIME_ENGINE_MOE_MLP_H_
#define TANDEM_RUNTIME_ENGINE_MOE_MLP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/moe/moe.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

class MoeMlp {
 public:
  // out[T, H] = the layer's MLP of x[T, H] (normalized hidden states; every rank passes the
  // same x), from this rank's slice of every expert: under tensor parallelism the ranks' outputs
  // sum to the layer's. `config` is the rank's (LocalModelConfig). out must not alias x.
  absl::Status Run(const ModelConfig& config, const LayerWeights& w, const float* x, int64_t T,
                   float* out, kernels::ThreadPool* pool);

 private:
  absl::Status Route(const ModelConfig& config, const LayerWeights& w, int64_t T);

  std::vector<float> router_logits_, gate_up_, act_, shared_;
  kernels::MoeRouting routing_;
  kernels::MoeScratch scratch_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_MOE_MLP_H_
