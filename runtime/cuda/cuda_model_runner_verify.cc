// CudaModelRunner's rejection sampling of draft-model drafts on the device (issue 34): Leviathan
// et al.'s rule for sampling requests, with the CPU engine's uniforms (kernels/sampling/
// rejection.h), so the CUDA backend no longer falls back to sample matching there.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/sampling/cuda/rejection_cuda.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "runtime/cuda/cuda_model_runner.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

// Grows `buffer` to at least `bytes` (its contents are not kept). The stream must be idle on it.
template <typename Buffer>
absl::Status Reserve(Buffer* buffer, int64_t bytes, const char* what) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  buffer->Reset();
  ASSIGN_OR_RETURN(*buffer, Buffer::Allocate(bytes, what));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaModelRunner::EnqueueRejection(const SchedulerOutput& batch, bool padded) {
  rejection_passes_.clear();
  const int64_t V = spec_.model_config.vocab_size;
  std::vector<kc::DeviceRejectionPass> passes;
  std::vector<int64_t> first_rows;  // each pass's first logit row
  int64_t r = 0, target_rows = 0, draft_rows = 0, workspace = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ScheduledSeq& seq = batch.seqs[s];
    if (!padded && !seq.samples && !seq.capture_prompt_logits) continue;  // Pack's rows
    const int64_t k = seq.samples ? seq.num_draft_tokens : 0;
    const int64_t first = r;
    r += k + 1;
    if (k == 0 || !seq.return_verify_logits ||
        static_cast<int64_t>(seq.draft_probs.size()) < k * V) {
      continue;
    }
    kc::DeviceRejectionPass pass{};
    pass.target_row = target_rows;
    pass.draft_row = draft_rows;
    pass.first_draft = draft_rows;  // one draft per draft row
    pass.num_drafts = static_cast<int32_t>(k);
    pass.seed = seq.sampling.seed;
    pass.first_step = static_cast<uint64_t>(seq.sample_step);
    passes.push_back(pass);
    first_rows.push_back(first);
    rejection_passes_.push_back({static_cast<int64_t>(s), k});
    target_rows += k + 1;
    draft_rows += k;
    workspace = std::max(workspace, kc::SampleTokensWorkspaceBytes(k + 1, V));
  }
  if (passes.empty()) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(passes.size());
  const int64_t passes_bytes = (n * static_cast<int64_t>(sizeof(passes[0])) + 15) / 16 * 16;
  const int64_t meta_bytes = passes_bytes + draft_rows * 4;
  const int64_t out_bytes = n * static_cast<int64_t>(sizeof(kc::DeviceRejectionResult));
  if (target_probs_dev_.bytes() < target_rows * V * 8 ||
      draft_probs_dev_.bytes() < draft_rows * V * 8 ||
      draft_probs_host_.bytes() < draft_rows * V * 8 ||
      rejection_meta_dev_.bytes() < meta_bytes + out_bytes ||
      rejection_meta_host_.bytes() < meta_bytes || rejection_out_host_.bytes() < out_bytes ||
      rejection_workspace_.bytes() < workspace) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // an earlier step may still use them
    RETURN_IF_ERROR(Reserve(&target_probs_dev_, target_rows * V * 8, "target probabilities"));
    RETURN_IF_ERROR(Reserve(&draft_probs_dev_, draft_rows * V * 8, "draft probabilities"));
    RETURN_IF_ERROR(Reserve(&draft_probs_host_, draft_rows * V * 8, "draft probabilities (host)"));
    RETURN_IF_ERROR(Reserve(&rejection_meta_dev_, meta_bytes + out_bytes, "rejection passes"));
    RETURN_IF_ERROR(Reserve(&rejection_meta_host_, meta_bytes, "rejection passes (host)"));
    RETURN_IF_ERROR(Reserve(&rejection_out_host_, out_bytes, "rejection results (host)"));
    RETURN_IF_ERROR(Reserve(&rejection_workspace_, workspace, "rejection workspace"));
  }
  // Host side: the passes, their drafts and their draft distributions, packed in launch order.
  char* meta = rejection_meta_host_.get<char>();
  std::memcpy(meta, passes.data(), passes.size() * sizeof(passes[0]));
  auto* drafts = reinterpret_cast<int32_t*>(meta + passes_bytes);
  double* q = draft_probs_host_.get<double>();
  for (const RejectionPassOf& p : rejection_passes_) {
    const ScheduledSeq& seq = batch.seqs[p.seq];
    std::copy_n(seq.new_tokens.begin() + 1, p.k, drafts);
    std::copy_n(seq.draft_probs.begin(), p.k * V, q);
    drafts += p.k;
    q += p.k * V;
  }
  char* meta_dev = rejection_meta_dev_.get<char>();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_dev, meta, meta_bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(draft_probs_dev_.data(), draft_probs_host_.data(),
                                       draft_rows * V * 8, cudaMemcpyHostToDevice, stream_));
  // The target's distributions at each pass's k + 1 rows, with the rows' sampling parameters.
  const auto* rows =
      reinterpret_cast<const kc::DeviceSamplingRow*>(meta_dev_.get<char>() + meta_.sampling_rows);
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(kc::TokenProbabilities(
        ModelLogits() + first_rows[i] * V, passes[i].num_drafts + 1, V, rows + first_rows[i],
        target_probs_dev_.get<double>() + passes[i].target_row * V, rejection_workspace_.data(),
        rejection_workspace_.bytes(), stream_));
  }
  auto* out_dev = reinterpret_cast<kc::DeviceRejectionResult*>(meta_dev + meta_bytes);
  RETURN_IF_ERROR(kc::RejectionSampleDrafts(
      target_probs_dev_.get<double>(), draft_probs_dev_.get<double>(),
      reinterpret_cast<const int32_t*>(meta_dev + passes_bytes),
      reinterpret_cast<const kc::DeviceRejectionPass*>(meta_dev), n, V, out_dev, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rejection_out_host_.data(), out_dev, out_bytes,
                                       cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

void CudaModelRunner::TakeRejection(const SchedulerOutput& batch, RunnerOutput* out) const {
  const auto* results = rejection_out_host_.get<kc::DeviceRejectionResult>();
  for (size_t i = 0; i < rejection_passes_.size(); ++i) {
    const RejectionPassOf& p = rejection_passes_[i];
    // As the engine's CPU verifier re-expresses a verdict (Engine::VerifyByRejection): the
    // accepted drafts, then the residual sample in place of the first rejected one, or the
    // bonus token as the step's sample after all k.
    const absl::Span<const int32_t> drafts = batch.seqs[p.seq].new_tokens.subspan(1, p.k);
    std::vector<int32_t>& samples = out->draft_samples[p.seq];
    samples.assign(drafts.begin(), drafts.end());
    if (results[i].accepted < p.k) {
      samples[results[i].accepted] = results[i].next_token;
    } else {
      out->sampled_tokens[p.seq] = results[i].next_token;
    }
  }
}

}  // namespace tandem::runtime::cuda
