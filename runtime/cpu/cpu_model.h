// The CPU backend's decoder as ModelRunner drives it: LlamaModel for the Llama family, MlaModel
// for DeepSeek multi-head latent attention, picked from the config by MakeCpuModel.
//
// Thread safety: as the models (Forward is not reentrant; weights immutable).
#ifndef TANDEM_RUNTIME_CPU_CPU_MODEL_H_
#define TANDEM_RUNTIME_CPU_CPU_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "comm/process_group.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/cpu/llama_model.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

class CpuModel {
 public:
  virtual ~CpuModel() = default;
  // LlamaModel::Forward's contract: new KV (or latents) into `cache`, logits of `logit_rows`.
  virtual absl::Status Forward(const ForwardInput& input, kernels::KvCacheView cache,
                               absl::Span<const int64_t> logit_rows,
                               std::vector<float>* logits) = 0;
  // The pool layout for `num_blocks` blocks of `block_size` tokens (KvLayoutForModel).
  virtual kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const kernels::DcpShard& dcp() const = 0;
  // MoE models: tokens routed to each expert so far (MoeMlp::expert_tokens); empty otherwise.
  virtual std::vector<uint64_t> ExpertTokens() const { return {}; }
};

// MlaModel::Create for config.IsMla(), else LlamaModel::Create (their errors). fp8_kv: the pool
// is FP8, an MLA model's latent pool (runtime/engine/kv_layout.h, Fp8LatentBlocks) or another
// model's K / V codes (LlamaModel::Create).
absl::StatusOr<std::unique_ptr<CpuModel>> MakeCpuModel(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       kernels::ThreadPool* pool,
                                                       comm::ProcessGroup* group,
                                                       kernels::DcpShard dcp, bool fp8_kv = false);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_CPU_MODEL_H_
