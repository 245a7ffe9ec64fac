// CudaModelRunner's CUDA graphs: which steps replay as graphs (the padded batch size and width
// of a decode / verify step, data-parallel attention's common size), the capture of a step, the
// agreement of DP ranks on capturing and the attention workspaces the graphs capture
// (cuda_model_runner.h).
#include <algorithm>
#include <tuple>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "runtime/cuda/cuda_model_runner.h"

namespace tandem::runtime::cuda {

int64_t CudaModelRunner::GraphSizeFor(int64_t num_seqs) const {
  for (int64_t s : graph_sizes_) {
    if (s >= num_seqs) return s;
  }
  return 0;
}

void CudaModelRunner::DropGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

int64_t CudaModelRunner::PaddedWidth(const SchedulerOutput& batch, int64_t* padded_seqs) const {
  // Data-parallel attention: decode steps padded alike on every DP rank (DpPaddedSeqs), the
  // rest eagerly and unpadded (their MoE layers read the row counts back).
  if (spec_.model_config.dp_attention) {
    *padded_seqs = DpPaddedSeqs(batch);
    return *padded_seqs > 0 ? 1 : 0;
  }
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  int64_t width = 1;
  bool verify = true;
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    width = std::max(width, n);
    // A verify pass: every sequence samples at its last token and at each of its drafts.
    verify = verify && seq.samples && !seq.capture_prompt_logits && n == 1 + seq.num_draft_tokens;
  }
  const int64_t size = GraphSizeFor(S);
  if (size == 0 || (width > 1 && (!verify || !config_.verify_graphs))) return 0;
  // Every padded token and row must fit the step buffers (max_rows_ >= max_seqs * (1 + K)).
  if (size * width > max_tokens_ || size * width > max_rows_) return 0;
  *padded_seqs = size;
  return width;
}

int64_t CudaModelRunner::DpPaddedSeqs(const SchedulerOutput& batch) const {
  if (!config_.dp_attention_graphs || !DpMoe()) return 0;
  int64_t most = batch.dp_decode_seqs;
  if (most < 0) {  // not split by a DP executor: every rank runs a step of this shape
    most = static_cast<int64_t>(batch.seqs.size());
    for (const ScheduledSeq& seq : batch.seqs) {
      if (seq.new_tokens.size() != 1 || seq.num_draft_tokens > 0) most = 0;
    }
  }
  const int64_t size = most > 0 ? GraphSizeFor(most) : 0;
  return size <= max_tokens_ && size <= max_rows_ ? size : 0;  // the MoE scratch: max_tokens_
}

bool CudaModelRunner::DpMoe() const {
  return spec_.model_config.dp_attention && comm_ != nullptr &&
         (model_ != nullptr || mla_model_ != nullptr);
}

void CudaModelRunner::SetMoeDispatchCapacity(int64_t capacity) {
  if (model_ != nullptr) model_->set_moe_dispatch_capacity(capacity);
  if (mla_model_ != nullptr) mla_model_->set_moe_dispatch_capacity(capacity);
}

absl::Status CudaModelRunner::DpIdleStep() {
  SetMoeDispatchCapacity(0);
  RETURN_IF_ERROR(model_ != nullptr ? model_->ForwardIdle(stream_)
                                    : mla_model_->ForwardIdle(stream_));
  return comm_->Synchronize(stream_);
}

absl::StatusOr<bool> CudaModelRunner::AnyRankCaptures(bool mine) {
  if (capture_flag_dev_.empty()) {
    ASSIGN_OR_RETURN(capture_flag_dev_, DeviceBuffer::Allocate(4, "capture flag"));
    ASSIGN_OR_RETURN(capture_flag_host_, PinnedBuffer::Allocate(4, "capture flag"));
  }
  *capture_flag_host_.get<float>() = mine ? 1.0f : 0.0f;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(capture_flag_dev_.data(), capture_flag_host_.data(), 4,
                                       cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(comm_->AllReduceSum(capture_flag_dev_.data(), 1, comm::CommDtype::kF32, stream_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(capture_flag_host_.data(), capture_flag_dev_.data(), 4,
                                       cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_ERROR(comm_->Synchronize(stream_));
  return *capture_flag_host_.get<float>() > 0.0f;
}

absl::StatusOr<cudaGraphExec_t> CudaModelRunner::GraphFor(const DeviceStep& step,
                                                          const StepAttentionPlan& plan,
                                                          int64_t width, bool greedy) {
  const auto key = std::make_tuple(step.attention.num_seqs, width, greedy);
  auto it = graphs_.find(key);
  if (spec_.model_config.dp_attention) {
    // While another rank captures (its eager run, then the capture), this one runs the step
    // eagerly before its graph: the MoE layers' all-to-alls meet as often on every rank.
    ASSIGN_OR_RETURN(const bool any, AnyRankCaptures(it == graphs_.end()));
    if (any && it != graphs_.end()) RETURN_IF_ERROR(Enqueue(step, plan, greedy));
  }
  if (it != graphs_.end()) return it->second;
  // One eager run first: cuBLASLt picks and caches its algorithms for these shapes outside the
  // capture (it must not allocate or query inside it). Re-running the step from the graph is
  // idempotent: the same K/V are written to the same slots and the same tokens sampled.
  RETURN_IF_ERROR(Enqueue(step, plan, greedy));
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = Enqueue(step, plan, greedy);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(inst);
  graphs_[key] = exec;
  ++stats_.graphs_captured;
  return exec;
}

namespace {

// A decode plan whose kernel merges its own splits runs in decode_workspace_.
bool InDecodeWorkspace(const StepAttentionPlan& plan) {
  return !plan.use_prefill && plan.decode.merge_in_kernel;
}

}  // namespace

void* CudaModelRunner::AttnWorkspace(const StepAttentionPlan& plan) {
  return InDecodeWorkspace(plan) ? decode_workspace_.data() : attn_workspace_.data();
}

absl::Status CudaModelRunner::EnsureAttnWorkspace(const StepAttentionPlan& plan) {
  const bool own = InDecodeWorkspace(plan);
  DeviceBuffer& buffer = own ? decode_workspace_ : attn_workspace_;
  int64_t bytes = plan.workspace_bytes();
  if (bytes <= buffer.bytes()) return absl::OkStatus();
  // The fp8 prefill widening's copy varies with every step: its whole budget at once, so the
  // workspace grows (and the graphs are dropped) once.
  if (plan.use_prefill && plan.prefill.widen_fp8) {
    bytes = std::max(bytes, config_.prefill_fp8_widen_max_bytes);
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  DropGraphs();  // they captured the old workspace's address
  buffer.Reset();
  ASSIGN_OR_RETURN(buffer, DeviceBuffer::Allocate(
                               bytes, own ? "decode attention workspace" : "attention workspace"));
  // The split counters start at zero; the decode kernel returns them to zero after every call.
  if (own) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer.data(), 0, bytes, stream_));
  return absl::OkStatus();
}

}  // namespace tandem::runtime::cuda
