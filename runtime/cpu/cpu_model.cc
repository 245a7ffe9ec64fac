#include "runtime/cpu/cpu_model.h"

#include <utility>

#include "common/status_macros.h"
#include "runtime/cpu/mla_model.h"

namespace tandem::runtime {
namespace {

// LlamaModel behind the CpuModel interface.
class LlamaCpuModel : public CpuModel {
 public:
  explicit LlamaCpuModel(std::unique_ptr<LlamaModel> model) : model_(std::move(model)) {}
  absl::Status Forward(const ForwardInput& input, kernels::KvCacheView cache,
                       absl::Span<const int64_t> logit_rows, std::vector<float>* logits) override {
    return model_->Forward(input, cache, logit_rows, logits);
  }
  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const override {
    return model_->KvLayout(num_blocks, block_size);
  }
  const ModelConfig& config() const override { return model_->config(); }
  const kernels::DcpShard& dcp() const override { return model_->dcp(); }
  std::vector<uint64_t> ExpertTokens() const override { return model_->moe_expert_tokens(); }

 private:
  std::unique_ptr<LlamaModel> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CpuModel>> MakeCpuModel(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       kernels::ThreadPool* pool,
                                                       comm::ProcessGroup* group,
                                                       kernels::DcpShard dcp, bool fp8_kv) {
  if (config.IsMla()) {
    ASSIGN_OR_RETURN(std::unique_ptr<MlaModel> mla,
                     MlaModel::Create(config, std::move(weights), pool, group, dcp, fp8_kv));
    return std::unique_ptr<CpuModel>(std::move(mla));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> llama,
                   LlamaModel::Create(config, std::move(weights), pool, group, dcp, fp8_kv));
  return std::unique_ptr<CpuModel>(new LlamaCpuModel(std::move(llama)));
}

}  // namespace tandem::runtime
