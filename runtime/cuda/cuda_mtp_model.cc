#include "runtime/cuda/cuda_mtp_model.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/layers/cuda/convert_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "runtime/cuda/dense_linear.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// `host` (fp32, `what`) into a new device buffer of `dtype`, converted on the device.
absl::StatusOr<DeviceBuffer> UploadF32(const std::vector<float>& host, ActDtype dtype,
                                       const char* what, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(host.size());
  ASSIGN_OR_RETURN(DeviceBuffer staging, DeviceBuffer::Allocate(n * 4, "MTP staging"));
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(n * 2, what));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging.data(), host.data(), n * 4, cudaMemcpyHostToDevice, stream));
  if (dtype == ActDtype::kBf16) {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging.get<float>(), n, out.get<__nv_bfloat16>(), stream));
  } else {
    RETURN_IF_ERROR(kc::ConvertFromF32(staging.get<float>(), n, out.get<__half>(), stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // staging is freed next
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMtpModel>> CudaMtpModel::Create(const ModelConfig& config,
                                                                   MtpWeights weights,
                                                                   const CudaModelOptions& options,
                                                                   cudaStream_t stream) {
  const int64_t H = config.hidden_size;
  if (options.comm != nullptr || options.dcp.size > 1 || options.dummy_seed.has_value()) {
    return absl::InvalidArgumentError(
        "the CUDA MTP layer runs on one rank from host weights (no communicator, DCP or device "
        "dummy weights)");
  }
  if (static_cast<int64_t>(weights.enorm.size()) != H ||
      static_cast<int64_t>(weights.hnorm.size()) != H ||
      static_cast<int64_t>(weights.eh_proj.size()) != 2 * H * H) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTP enorm / hnorm / eh_proj do not match hidden_size ", H));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<CudaMlaModel> block,
      CudaMlaModel::Create(MtpBlockConfig(config), std::move(weights.block), options, stream));
  std::unique_ptr<CudaMtpModel> model(new CudaMtpModel(options, std::move(block)));
  ASSIGN_OR_RETURN(model->gemm_, kc::CublasLtGemm::Create());
  RETURN_IF_ERROR(model->Upload(weights, stream));
  const int64_t T = options.max_tokens;
  struct Item {
    DeviceBuffer* b;
    int64_t elems;
    const char* what;
  } items[] = {{&model->h_, T * H, "MTP h"},
               {&model->e_, T * H, "MTP e"},
               {&model->normed_, T * H, "MTP normed"},
               {&model->concat_, T * 2 * H, "MTP concat"},
               {&model->x_, T * H, "MTP x"}};
  for (const Item& it : items) {
    ASSIGN_OR_RETURN(*it.b, DeviceBuffer::Allocate(it.elems * 2, it.what));
  }
  model->block_->set_input_embeds(model->x_.data());
  return model;
}

absl::Status CudaMtpModel::Upload(const MtpWeights& w, cudaStream_t stream) {
  ASSIGN_OR_RETURN(enorm_, UploadF32(w.enorm, options_.dtype, "MTP enorm", stream));
  ASSIGN_OR_RETURN(hnorm_, UploadF32(w.hnorm, options_.dtype, "MTP hnorm", stream));
  ASSIGN_OR_RETURN(eh_proj_, UploadF32(w.eh_proj, options_.dtype, "MTP eh_proj", stream));
  return absl::OkStatus();
}

absl::Status CudaMtpModel::Forward(const DeviceStep& step, const kc::DeviceKvCache& cache,
                                   const StepAttentionPlan& plan, const float* input_hidden,
                                   cudaStream_t stream) {
  if (step.num_tokens <= 0 || step.num_tokens > options_.max_tokens || input_hidden == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("MTP Forward: ", step.num_tokens,
                                                   " tokens (at most ", options_.max_tokens,
                                                   ") and the input hidden states are needed"));
  }
  RETURN_IF_ERROR(options_.dtype == ActDtype::kBf16
                      ? InputT<__nv_bfloat16>(step, input_hidden, stream)
                      : InputT<__half>(step, input_hidden, stream));
  return block_->Forward(step, cache, plan, nullptr, stream);
}

template <typename T>
absl::Status CudaMtpModel::InputT(const DeviceStep& step, const float* input_hidden,
                                  cudaStream_t stream) {
  const ModelConfig& c = block_->config();
  const int64_t Tn = step.num_tokens, H = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  T* concat = concat_.get<T>();
  // e: ids outside [0, V) (the runner's -1 at position 0) embed as zero rows.
  RETURN_IF_ERROR(kc::VocabShardEmbedding<T>(step.token_ids, Tn, block_->embed_tokens().get<T>(), 0,
                                             V, H, e_.get<T>(), stream));
  RETURN_IF_ERROR(
      kc::RmsNorm<T>(e_.get<T>(), enorm_.get<T>(), Tn, H, eps, normed_.get<T>(), stream));
  // [enorm(e) | hnorm(h)]: the embedding's half first, as the checkpoints are trained.
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(concat, 2 * H * sizeof(T), normed_.data(), H * sizeof(T),
                                         H * sizeof(T), Tn, cudaMemcpyDeviceToDevice, stream));
  RETURN_IF_ERROR(kc::ConvertFromF32(input_hidden, Tn * H, h_.get<T>(), stream));
  RETURN_IF_ERROR(
      kc::RmsNorm<T>(h_.get<T>(), hnorm_.get<T>(), Tn, H, eps, normed_.get<T>(), stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(concat + H, 2 * H * sizeof(T), normed_.data(),
                                         H * sizeof(T), H * sizeof(T), Tn, cudaMemcpyDeviceToDevice,
                                         stream));
  return DenseLinear<T, T>(*gemm_, concat, eh_proj_.get<T>(), nullptr, Tn, H, 2 * H, x_.get<T>(),
                           stream, options_.programmatic_launch);
}

}  // namespace tandem::runtime::cuda
