// CudaModelRunner's hidden-state traffic for speculative decoding with DeepSeek's MTP layer: the
// MTP runner (CreateMtp) and its input hidden states, and the final hidden states a step returns.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/model/half.h"

namespace tandem::runtime::cuda {

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::CreateMtp(
    const CudaBackendConfig& config, const ExecutorSpec& spec, MtpWeights weights) {
  if (!spec.model_config.IsMla()) {
    return absl::InvalidArgumentError(absl::StrCat("an MTP layer needs a DeepSeek MLA target, not ",
                                                   spec.model_config.architecture));
  }
  if (config.group != nullptr || config.dcp_size > 1 || config.dummy_seed.has_value() ||
      config.fp8_kv) {
    return absl::InvalidArgumentError(
        "the CUDA MTP runner is one rank with host weights and a 16-bit latent pool (no group, "
        "DCP, device dummy weights or FP8 KV)");
  }
  return Build(
      config, spec,
      [&weights, &spec](CudaModelRunner* r,
                        const CudaModelOptions& options) -> absl::StatusOr<kernels::KvCacheLayout> {
        ASSIGN_OR_RETURN(r->mtp_model_, CudaMtpModel::Create(spec.model_config, std::move(weights),
                                                             options, r->stream_));
        const int64_t n = r->max_tokens_ * spec.model_config.hidden_size;
        ASSIGN_OR_RETURN(r->input_hidden_,
                         DeviceBuffer::Allocate(n * 4, "MTP input hidden states"));
        // Padding rows of graph steps read rows nobody wrote: zeros, never NaNs.
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(r->input_hidden_.data(), 0, n * 4, r->stream_));
        return r->mtp_model_->KvLayout(spec.num_blocks, spec.block_size);
      });
}

absl::Status CudaModelRunner::UploadInputHidden(const SchedulerOutput& batch, int64_t num_tokens) {
  const int64_t H = spec_.model_config.hidden_size;
  if (mtp_model_ == nullptr) {
    if (batch.input_hidden.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("input hidden states given to a runner without MTP layer");
  }
  // Zero rows (a catch-up over an adaptive pause) are set on the device, not sent.
  ASSIGN_OR_RETURN(const std::vector<HiddenRowRun> runs, InputHiddenRuns(batch, H));
  float* dst = input_hidden_.get<float>();
  for (const HiddenRowRun& run : runs) {
    if (run.dst_row + run.rows > num_tokens) {
      return absl::InternalError("MTP input hidden rows past the step's tokens");
    }
    if (run.zero) {
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(dst + run.dst_row * H, 0, run.rows * H * sizeof(float), stream_));
    } else {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst + run.dst_row * H, batch.input_hidden.data() + run.src_row * H,
                          run.rows * H * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::EnqueueHiddenCopy(const SchedulerOutput& batch, int64_t num_tokens) {
  if (!batch.return_hidden_states) return absl::OkStatus();
  const auto* rows = static_cast<const char*>(mtp_model_ != nullptr   ? mtp_model_->hidden_out()
                                              : mla_model_ != nullptr ? mla_model_->normed_hidden()
                                                                      : nullptr);
  if (rows == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("the CUDA backend returns hidden states (MTP drafting) for DeepSeek MLA "
                     "models only, not ",
                     spec_.model_config.architecture));
  }
  const int64_t row_bytes = spec_.model_config.hidden_size * 2;
  const int64_t num_rows = std::max<int64_t>(num_tokens, static_cast<int64_t>(batch.seqs.size()));
  if (hidden_host_.bytes() < num_rows * row_bytes) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // an earlier copy may still target it
    hidden_host_.Reset();
    ASSIGN_OR_RETURN(hidden_host_,
                     PinnedBuffer::Allocate(std::max(max_tokens_, num_rows) * row_bytes,
                                            "hidden states (host)"));
  }
  char* host = hidden_host_.get<char>();
  if (!batch.return_last_hidden_only) {
    // Rows 0 .. num_tokens - 1 are the batch's tokens in order (a padded step's padding follows).
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, rows, num_tokens * row_bytes, cudaMemcpyDeviceToHost, stream_));
    return absl::OkStatus();
  }
  // One row per sequence (its last token's), runs of consecutive rows in one copy each.
  const std::vector<int64_t> last = LastTokenRows(batch);
  for (size_t s = 0; s < last.size();) {
    size_t e = s + 1;
    while (e < last.size() && last[s] >= 0 && last[e] == last[e - 1] + 1) ++e;
    if (last[s] >= 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host + s * row_bytes, rows + last[s] * row_bytes,
                                           (e - s) * row_bytes, cudaMemcpyDeviceToHost, stream_));
    }
    s = e;
  }
  return absl::OkStatus();
}

void CudaModelRunner::TakeHidden(const SchedulerOutput& batch, int64_t num_tokens,
                                 RunnerOutput* out) const {
  if (!batch.return_hidden_states) return;
  const int64_t rows =
      batch.return_last_hidden_only ? static_cast<int64_t>(batch.seqs.size()) : num_tokens;
  const int64_t n = rows * spec_.model_config.hidden_size;
  const uint16_t* bits = hidden_host_.get<uint16_t>();
  out->hidden_states.resize(static_cast<size_t>(n));
  float* dst = out->hidden_states.data();
  if (config_.dtype == ActDtype::kBf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(bits[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(bits[i]);
  }
}

}  // namespace tandem::runtime::cuda
