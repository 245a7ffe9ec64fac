// DeepSeek-V3's multi-token prediction (MTP) layer on the CPU backend, as a CpuModel the engine's
// ModelRunner drives on a latent KV cache of its own (one layer; speculative decoding's
// --speculative_method=mtp, runtime/engine/mtp_proposer.h).
//
// Token t at position i, with h the hidden state paired with it (below), computes as vLLM's
// DeepSeekMultiTokenPredictorLayer does:
//   e = embed_tokens(t), zeroed at position 0      (nothing precedes it)
//   x = eh_proj([enorm(e) | hnorm(h)])              [T, 2H] -> [T, H]
//   y = decoder_layer(x)                            MLA attention over this layer's own latent
//                                                   cache + MoE / dense MLP, residual added
//   logits = shared_head.head(shared_head.norm(y))
// and returns y (before shared_head.norm) as its hidden state (ForwardInput::hidden_out), the h of
// the next chained draft. The decoder layer is MlaModel's code on a one-layer model
// (MtpBlockConfig), so it computes exactly as the target's layers do.
//
// Which positions: the MTP run at position i takes the token at i + 1 and the target's final
// hidden state of position i (the final norm's output, as vLLM and SGLang pass it; the input ids
// are shifted by one, the positions are not) and predicts the token at i + 2. A chained draft
// takes this layer's own y of the position before instead.
//
// Thread safety: as MlaModel (Forward is not reentrant; weights immutable).
#ifndef TANDEM_RUNTIME_CPU_MTP_MODEL_H_
#define TANDEM_RUNTIME_CPU_MTP_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/mla_model.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {

class MtpModel : public CpuModel {
 public:
  // `config` is the target model's (DeepSeek MLA, no tensor parallelism). INVALID_ARGUMENT when
  // the weights do not match it (MlaModel::Create's checks on the block, and the MTP tensors).
  static absl::StatusOr<std::unique_ptr<MtpModel>> Create(const ModelConfig& config,
                                                          MtpWeights weights,
                                                          kernels::ThreadPool* pool);

  // REQUIRES: input.input_hidden is [T, hidden]. input.hidden_out (optional) receives y.
  absl::Status Forward(const ForwardInput& input, kernels::KvCacheView cache,
                       absl::Span<const int64_t> logit_rows, std::vector<float>* logits) override;
  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const override {
    return block_->KvLayout(num_blocks, block_size);
  }
  std::vector<uint64_t> ExpertTokens() const override { return block_->ExpertTokens(); }
  const ModelConfig& config() const override { return block_->config(); }
  const kernels::DcpShard& dcp() const override { return block_->dcp(); }

 private:
  MtpModel(std::unique_ptr<MlaModel> block, MtpWeights weights, kernels::ThreadPool* pool);

  std::unique_ptr<MlaModel> block_;  // holds the decoder layer, shared head and embedding
  const MtpWeights mtp_;             // enorm, hnorm, eh_proj (its `block` moved into block_)
  kernels::ThreadPool* const pool_;
  std::vector<float> embed_, concat_, input_;  // scratch
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_CPU_MTP_MODEL_H_
