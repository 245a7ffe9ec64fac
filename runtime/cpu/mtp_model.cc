#include "runtime/cpu/mtp_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/norm.h"
#include "runtime/cpu/tp_collectives.h"

namespace tandem::runtime {

absl::StatusOr<std::unique_ptr<MtpModel>> MtpModel::Create(const ModelConfig& config,
                                                           MtpWeights weights,
                                                           kernels::ThreadPool* pool) {
  const int64_t H = config.hidden_size;
  if (static_cast<int64_t>(weights.enorm.size()) != H ||
      static_cast<int64_t>(weights.hnorm.size()) != H ||
      static_cast<int64_t>(weights.eh_proj.size()) != 2 * H * H) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTP enorm / hnorm / eh_proj do not match hidden_size ", H));
  }
  ModelWeights block = std::move(weights.block);
  ASSIGN_OR_RETURN(std::unique_ptr<MlaModel> model,
                   MlaModel::Create(MtpBlockConfig(config), std::move(block), pool));
  return std::unique_ptr<MtpModel>(new MtpModel(std::move(model), std::move(weights), pool));
}

MtpModel::MtpModel(std::unique_ptr<MlaModel> block, MtpWeights weights, kernels::ThreadPool* pool)
    : block_(std::move(block)), mtp_(std::move(weights)), pool_(pool) {}

absl::Status MtpModel::Forward(const ForwardInput& input, kernels::KvCacheView cache,
                               absl::Span<const int64_t> logit_rows, std::vector<float>* logits) {
  const ModelConfig& c = block_->config();
  const int64_t T = static_cast<int64_t>(input.token_ids.size()), H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (static_cast<int64_t>(input.input_hidden.size()) != T * H ||
      static_cast<int64_t>(input.positions.size()) != T) {
    return absl::InvalidArgumentError("MTP Forward: input_hidden must be [T, hidden]");
  }
  embed_.resize(T * H);
  concat_.resize(T * 2 * H);
  input_.resize(T * H);
  const ModelWeights& w = block_->weights();
  RETURN_IF_ERROR(TpEmbedding(input.token_ids.data(), T, w.embed_tokens.data(), c.vocab_size, H, 0,
                              c.vocab_size, nullptr, embed_.data()));
  for (int64_t t = 0; t < T; ++t) {
    float* e = embed_.data() + t * H;
    // vLLM masks position 0's embedding: no token precedes it (RMSNorm keeps the zeros).
    if (input.positions[t] == 0) std::fill(e, e + H, 0.0f);
    // [enorm(e) | hnorm(h)]: the embedding's half first, as the checkpoints are trained.
    kernels::cpu::RmsNorm(e, mtp_.enorm.data(), 1, H, eps, concat_.data() + t * 2 * H);
    kernels::cpu::RmsNorm(input.input_hidden.data() + t * H, mtp_.hnorm.data(), 1, H, eps,
                          concat_.data() + t * 2 * H + H);
  }
  kernels::cpu::Linear(concat_.data(), mtp_.eh_proj.data(), nullptr, T, H, 2 * H, input_.data(),
                       pool_);
  ForwardInput inner = input;
  inner.input_hidden = {};
  inner.input_embeds = input_;
  inner.hidden_out_before_norm = true;  // y, before shared_head.norm
  return block_->Forward(inner, cache, logit_rows, logits);
}

}  // namespace tandem::runtime
