// DeepSeek-V3's multi-token prediction (MTP) layer on the CUDA backend (speculative decoding's
// --speculative_method=mtp; runtime/engine/mtp_proposer.h drives it): the twin of
// runtime/cpu/mtp_model.h, bf16/fp16 with fp32 accumulation, on a latent KV pool of its own.
// An FP8 checkpoint's layer (DeepSeek-V3: the block's projections and experts e4m3 with 128x128
// scales, the glue and heads bf16) keeps its block e4m3: CudaMlaModel's FP8 path (bf16 only).
//
// Token t at position i with the hidden state h paired with it (the target's final hidden state
// of position i, after its final norm; or this layer's own output for a chained draft):
//   e = embed_tokens(t), zero at position 0   (the runner feeds token id -1 there: a zero row)
//   x = eh_proj([enorm(e) | hnorm(h)])        [T, 2H] -> [T, H]
//   y = decoder_layer(x)                      CudaMlaModel on the one-layer MtpBlockConfig: MLA
//                                             over this layer's latent pool + MoE / dense MLP
//   logits = shared_head.head(shared_head.norm(y))
// hidden_out() is y (before shared_head.norm), the h of the next chained draft.
//
// Forward() only enqueues work (the input hidden states are read from a device buffer the runner
// fills before it), so decode-shaped steps can be captured in a CUDA graph.
//
// Thread safety: not thread-safe; one runner drives it. Weights are immutable after Create().
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MTP_MODEL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MTP_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "runtime/cuda/cuda_llama_model.h"
#include "runtime/cuda/cuda_mla_model.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime::cuda {

class CudaMtpModel {
 public:
  // `config` is the target model's (DeepSeek MLA); `weights` its first MTP layer (fp32 host,
  // uploaded converted to options.dtype). One rank: options without a communicator, DCP or dummy
  // weights. INVALID_ARGUMENT for weights that do not match the config (CudaMlaModel's checks on
  // the block, and enorm / hnorm / eh_proj).
  static absl::StatusOr<std::unique_ptr<CudaMtpModel>> Create(const ModelConfig& config,
                                                              MtpWeights weights,
                                                              const CudaModelOptions& options,
                                                              cudaStream_t stream);

  kernels::KvCacheLayout KvLayout(int64_t num_blocks, int64_t block_size) const {
    return block_->KvLayout(num_blocks, block_size);
  }
  kernels::cuda::KvDtype kv_dtype() const { return block_->kv_dtype(); }

  // Enqueues the layer over `step` (its token ids already -1 at position 0): `input_hidden` is
  // device fp32 [step.num_tokens, hidden], the h of each row (padding rows: any finite values).
  // Writes the step's latents into `cache`, logits() [R, vocab] fp32 and hidden_out().
  absl::Status Forward(const DeviceStep& step, const kernels::cuda::DeviceKvCache& cache,
                       const StepAttentionPlan& plan, const float* input_hidden,
                       cudaStream_t stream);

  const float* logits() const { return block_->logits(); }
  // y of every row of the last Forward, [T, hidden] of the activation dtype.
  const void* hidden_out() const { return block_->hidden_before_norm(); }
  void set_gemm_autotune_max_m(int64_t max_m) {
    block_->set_gemm_autotune_max_m(max_m);
    gemm_->set_autotune_max_m(max_m);
  }
  // The block's config (MtpBlockConfig of the target's).
  const ModelConfig& config() const { return block_->config(); }

 private:
  CudaMtpModel(const CudaModelOptions& options, std::unique_ptr<CudaMlaModel> block)
      : options_(options), block_(std::move(block)) {}
  absl::Status Upload(const MtpWeights& weights, cudaStream_t stream);
  template <typename T>
  absl::Status InputT(const DeviceStep& step, const float* input_hidden, cudaStream_t stream);

  const CudaModelOptions options_;
  std::unique_ptr<CudaMlaModel> block_;
  std::unique_ptr<kernels::cuda::CublasLtGemm> gemm_;
  DeviceBuffer enorm_, hnorm_, eh_proj_;  // [H], [H], [H, 2H] of the activation dtype
  // Scratch, [max_tokens, *] of the activation dtype: h converted, e, a normed half, the
  // concatenation [T, 2H] and eh_proj's output x (the block's input rows).
  DeviceBuffer h_, e_, normed_, concat_, x_;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MTP_MODEL_H_
