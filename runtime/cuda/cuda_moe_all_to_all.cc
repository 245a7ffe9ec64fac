#include "runtime/cuda/cuda_moe_all_to_all.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/moe/moe_dispatch.h"
#include "kernels/moe/moe_dispatch_cuda.h"

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;

absl::Status Alloc(DeviceBuffer* b, int64_t bytes, const char* what) {
  ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(bytes, what));
  return absl::OkStatus();
}

}  // namespace

CudaMoeAllToAll::CudaMoeAllToAll(const ModelConfig& c, int64_t max_tokens,
                                 comm::DeviceCommunicator* comm)
    : comm_(comm),
      n_(comm->size()),
      hidden_(c.hidden_size),
      top_k_(c.num_experts_per_tok),
      width_(kernels::MoeDispatchRowWidth(c.hidden_size, c.num_experts_per_tok)),
      max_tokens_(max_tokens),
      max_received_(max_tokens * comm->size()),
      zero_slot_(static_cast<int32_t>(c.NumHeldExperts())) {}

absl::StatusOr<std::unique_ptr<CudaMoeAllToAll>> CudaMoeAllToAll::Create(
    const ModelConfig& c, int64_t max_tokens, comm::DeviceCommunicator* comm) {
  if (comm == nullptr || c.expert_placement == nullptr || !c.dp_attention ||
      c.expert_placement->num_ranks() != comm->size() || c.expert_rank != comm->rank() ||
      comm->size() > kernels::kMoeDispatchMaxRanks || max_tokens < 1 || c.hidden_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoE all-to-all: needs the rank's data-parallel attention config with an expert "
        "placement over the communicator's ranks (placement over ",
        c.expert_placement == nullptr ? 0 : c.expert_placement->num_ranks(), " ranks, rank ",
        c.expert_rank, "; communicator rank ", comm == nullptr ? -1 : comm->rank(), " of ",
        comm == nullptr ? 0 : comm->size(), ", at most ", kernels::kMoeDispatchMaxRanks,
        "), max_tokens ", max_tokens, " >= 1 and hidden ", c.hidden_size, " a multiple of 8"));
  }
  std::unique_ptr<CudaMoeAllToAll> a(new CudaMoeAllToAll(c, max_tokens, comm));
  const int64_t E = c.num_experts, n = a->n_, H = a->hidden_, W = a->width_;
  const ExpertPlacement& placement = *c.expert_placement;
  std::vector<int32_t> slot(E, -1);
  for (int r = 0; r < n; ++r) {
    const std::vector<int32_t>& held = placement.experts_of(r);
    for (size_t s = 0; s < held.size(); ++s) slot[held[s]] = static_cast<int32_t>(s);
  }
  RETURN_IF_ERROR(Alloc(&a->rank_of_, E * 4, "moe a2a rank of expert"));
  RETURN_IF_ERROR(Alloc(&a->slot_in_owner_, E * 4, "moe a2a slot of expert"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(a->rank_of_.data(), placement.rank_of_expert().data(), E * 4,
                                  cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(a->slot_in_owner_.data(), slot.data(), E * 4, cudaMemcpyHostToDevice));
  const int64_t sent_rows = max_tokens * n;  // each token at most once per rank
  RETURN_IF_ERROR(Alloc(&a->pos_, max_tokens * n * 4, "moe a2a row positions"));
  RETURN_IF_ERROR(Alloc(&a->counts_, n * 4, "moe a2a counts"));
  RETURN_IF_ERROR(Alloc(&a->all_counts_, n * n * 4, "moe a2a counts matrix"));
  ASSIGN_OR_RETURN(a->all_counts_host_, PinnedBuffer::Allocate(n * n * 4, "moe a2a counts"));
  RETURN_IF_ERROR(Alloc(&a->send_, sent_rows * W * 2, "moe a2a send rows"));
  RETURN_IF_ERROR(Alloc(&a->recv_, a->max_received_ * W * 2, "moe a2a received rows"));
  RETURN_IF_ERROR(Alloc(&a->received_x_, a->max_received_ * H * 2, "moe a2a received x"));
  RETURN_IF_ERROR(Alloc(&a->expert_out_, a->max_received_ * H * 2, "moe a2a expert out"));
  RETURN_IF_ERROR(Alloc(&a->back_, sent_rows * H * 2, "moe a2a returned rows"));
  a->send_words_.resize(n);
  a->recv_words_.resize(n);
  return a;
}

template <typename T>
absl::StatusOr<int64_t> CudaMoeAllToAll::Dispatch(const T* x, int64_t num_tokens,
                                                  const int32_t* expert_ids, const float* weights,
                                                  int64_t* load, int32_t* recv_ids,
                                                  float* recv_weights, cudaStream_t stream,
                                                  int64_t capacity) {
  static_assert(sizeof(T) == 2, "16-bit activations");
  if (num_tokens < 0 || num_tokens > max_tokens_ || capacity < 0 || capacity > max_tokens_ ||
      (capacity > 0 && capacity < num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("MoE all-to-all: ", num_tokens,
                                                   " tokens, capacity ", capacity, ", sized for ",
                                                   max_tokens_));
  }
  const int32_t* pos = pos_.get<int32_t>();
  int32_t* counts = counts_.get<int32_t>();
  capacity_ = capacity;
  RETURN_IF_ERROR(kc::MoePlanDispatch(expert_ids, num_tokens, top_k_, rank_of_.get<int32_t>(), n_,
                                      pos_.get<int32_t>(), counts, load, stream));
  RETURN_IF_ERROR(kc::MoeDispatchPack<T>(x, num_tokens, hidden_, expert_ids, weights, top_k_,
                                         rank_of_.get<int32_t>(), slot_in_owner_.get<int32_t>(),
                                         pos, counts, n_, send_.get<T>(), stream, capacity));
  if (capacity > 0) {  // the fixed layout: C rows each way, nothing read back
    send_rows_.assign(n_, capacity);
    recv_rows_.assign(n_, capacity);
    send_words_.assign(n_, capacity * width_ / 2);
    recv_words_ = send_words_;
    RETURN_IF_ERROR(comm_->AllToAll(send_.data(), send_words_, recv_.data(), recv_words_,
                                    comm::CommDtype::kF32, stream));
    ++collectives_;
    RETURN_IF_ERROR(kc::MoeDispatchUnpack<T>(recv_.get<T>(), n_ * capacity, hidden_, top_k_,
                                             zero_slot_, received_x_.get<T>(), recv_ids,
                                             recv_weights, stream));
    return n_ * capacity;
  }
  // Splits: every rank's counts (int32 words moved as fp32 words), read back once.
  RETURN_IF_ERROR(comm_->AllGather(counts, all_counts_.data(), n_, comm::CommDtype::kF32, stream));
  ++collectives_;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all_counts_host_.data(), all_counts_.data(), n_ * n_ * 4,
                                       cudaMemcpyDeviceToHost, stream));
  RETURN_IF_ERROR(comm_->Synchronize(stream));
  ASSIGN_OR_RETURN(
      kernels::MoeDispatchSplits splits,
      kernels::MoeDispatchSplitsOf(absl::MakeConstSpan(all_counts_host_.get<int32_t>(), n_ * n_),
                                   n_, comm_->rank(), max_received_));
  send_rows_ = splits.send_rows;
  recv_rows_ = splits.recv_rows;
  for (int d = 0; d < n_; ++d) {  // width_ 16-bit elements = width_ / 2 words a row
    send_words_[d] = send_rows_[d] * width_ / 2;
    recv_words_[d] = recv_rows_[d] * width_ / 2;
  }
  RETURN_IF_ERROR(comm_->AllToAll(send_.data(), send_words_, recv_.data(), recv_words_,
                                  comm::CommDtype::kF32, stream));
  ++collectives_;
  RETURN_IF_ERROR(kc::MoeDispatchUnpack<T>(recv_.get<T>(), splits.received, hidden_, top_k_,
                                           zero_slot_, received_x_.get<T>(), recv_ids, recv_weights,
                                           stream));
  return splits.received;
}

template <typename T>
absl::Status CudaMoeAllToAll::Combine(int64_t num_tokens, const T* shared, const T* shared_gate,
                                      const T* x, T* out, cudaStream_t stream) {
  for (int d = 0; d < n_; ++d) {  // the inverse splits, hidden_ / 2 words a row
    send_words_[d] = recv_rows_[d] * hidden_ / 2;
    recv_words_[d] = send_rows_[d] * hidden_ / 2;
  }
  RETURN_IF_ERROR(comm_->AllToAll(expert_out_.data(), send_words_, back_.data(), recv_words_,
                                  comm::CommDtype::kF32, stream));
  ++collectives_;
  return kc::MoeDispatchCombine<T>(back_.get<T>(), pos_.get<int32_t>(), counts_.get<int32_t>(), n_,
                                   num_tokens, hidden_, shared, shared_gate, x, out, stream,
                                   capacity_);
}

#define TANDEM_CUDA_MOE_ALL_TO_ALL_INSTANTIATE(T)                                                  \
  template absl::StatusOr<int64_t> CudaMoeAllToAll::Dispatch<T>(const T*, int64_t, const int32_t*, \
                                                                const float*, int64_t*, int32_t*,  \
                                                                float*, cudaStream_t, int64_t);    \
  template absl::Status CudaMoeAllToAll::Combine<T>(int64_t, const T*, const T*, const T*, T*,     \
                                                    cudaStream_t);
TANDEM_CUDA_MOE_ALL_TO_ALL_INSTANTIATE(__nv_bfloat16)
TANDEM_CUDA_MOE_ALL_TO_ALL_INSTANTIATE(__half)
#undef TANDEM_CUDA_MOE_ALL_TO_ALL_INSTANTIATE

}  // namespace tandem::runtime::cuda
