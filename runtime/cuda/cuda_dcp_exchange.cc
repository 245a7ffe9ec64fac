#include "runtime/cuda/cuda_dcp_exchange.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/dcp_exchange.h"

namespace tandem::runtime::cuda {

CudaDcpExchange::CudaDcpExchange(const kernels::DcpShard& dcp, comm::DeviceCommunicator* comm,
                                 int64_t num_heads, int64_t head_dim, int64_t elem_bytes)
    : dcp_(dcp),
      comm_(comm),
      num_heads_(num_heads),
      head_dim_(head_dim),
      elem_bytes_(elem_bytes),
      wire_dim_(elem_bytes > 0 ? (head_dim * elem_bytes + 15) / 16 * 16 / elem_bytes : head_dim),
      counts_(comm->size(), 0) {}

absl::StatusOr<std::unique_ptr<CudaDcpExchange>> CudaDcpExchange::Create(
    const kernels::DcpShard& dcp, comm::DeviceCommunicator* comm, int64_t max_tokens,
    int64_t num_heads, int64_t head_dim, int64_t elem_bytes) {
  if (comm == nullptr || dcp.size <= 1 || !kernels::DcpShardValid(dcp) ||
      comm->size() % dcp.size != 0 ||
      kernels::DcpShardOfTpRank(comm->rank(), dcp.size) != dcp.rank || num_heads % dcp.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DCP size ", dcp.size, " rank ", dcp.rank, " interleave ", dcp.interleave,
        " does not fit a group of ", comm == nullptr ? 1 : comm->size(), " ranks with ", num_heads,
        " local attention heads (dcp must divide both; rank = group rank % dcp)"));
  }
  std::unique_ptr<CudaDcpExchange> x(
      new CudaDcpExchange(dcp, comm, num_heads, head_dim, elem_bytes));
  kernels::DcpExchangeLayout layout;
  layout.num_tokens = max_tokens;
  layout.num_heads = num_heads;
  layout.head_dim = x->wire_dim_;
  layout.dcp_size = dcp.size;
  layout.elem_bytes = elem_bytes;
  RETURN_IF_ERROR(layout.Validate());
  ASSIGN_OR_RETURN(x->lse_, DeviceBuffer::Allocate(max_tokens * num_heads * 4, "DCP lse"));
  ASSIGN_OR_RETURN(x->send_, DeviceBuffer::Allocate(layout.BufferBytes(), "DCP send"));
  ASSIGN_OR_RETURN(x->recv_, DeviceBuffer::Allocate(layout.BufferBytes(), "DCP recv"));
  ASSIGN_OR_RETURN(
      x->merged_, DeviceBuffer::Allocate(max_tokens * layout.HeadsPerRank() * head_dim * elem_bytes,
                                         "DCP merged attention"));
  if (x->wire_dim_ != head_dim) {
    const int64_t row = x->wire_dim_ * elem_bytes;
    ASSIGN_OR_RETURN(x->padded_in_,
                     DeviceBuffer::Allocate(max_tokens * num_heads * row, "DCP padded heads"));
    ASSIGN_OR_RETURN(
        x->padded_out_,
        DeviceBuffer::Allocate(max_tokens * layout.HeadsPerRank() * row, "DCP padded merge"));
    // The padding columns are never written after this: zero, so the wire carries no garbage.
    CUDA_RETURN_IF_ERROR(cudaMemset(x->padded_in_.data(), 0, x->padded_in_.bytes()));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  return x;
}

template <typename T>
absl::Status CudaDcpExchange::Exchange(const T* attn, int64_t num_tokens, cudaStream_t stream) {
  kernels::DcpExchangeLayout layout;
  layout.num_tokens = num_tokens;
  layout.num_heads = num_heads_;
  layout.head_dim = wire_dim_;
  layout.dcp_size = dcp_.size;
  layout.elem_bytes = elem_bytes_;
  RETURN_IF_ERROR(layout.Validate());
  if (layout.BufferBytes() > send_.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DCP exchange of ", num_tokens, " tokens exceeds the buffers' bound"));
  }
  const bool padded = wire_dim_ != head_dim_;
  const int64_t row = head_dim_ * elem_bytes_, wire_row = wire_dim_ * elem_bytes_;
  if (padded) {  // [T * H] rows of head_dim -> rows of wire_dim (the padding stays zero)
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(padded_in_.data(), wire_row, attn, row, row,
                                           num_tokens * num_heads_, cudaMemcpyDeviceToDevice,
                                           stream));
  }
  const T* packed = padded ? padded_in_.get<T>() : attn;
  RETURN_IF_ERROR(
      kernels::cuda::DcpPackForExchange<T>(packed, lse(), layout, send_.data(), stream));
  // The slice's ranks are contiguous in the group: [first, first + dcp.size); the rest get and
  // send nothing. Counts are fp32 words (regions are multiples of 16 bytes).
  const int64_t words = layout.RegionBytes() / 4;
  const int first = comm_->rank() - static_cast<int>(dcp_.rank);
  std::fill(counts_.begin(), counts_.end(), 0);
  for (int64_t k = 0; k < dcp_.size; ++k) counts_[first + k] = words;
  RETURN_IF_ERROR(
      comm_->AllToAll(send_.data(), counts_, recv_.data(), counts_, comm::CommDtype::kF32, stream));
  if (!padded) {
    return kernels::cuda::DcpMergeReceived<T>(recv_.data(), layout, merged<T>(), nullptr, stream);
  }
  RETURN_IF_ERROR(kernels::cuda::DcpMergeReceived<T>(recv_.data(), layout, padded_out_.get<T>(),
                                                     nullptr, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(merged_.data(), row, padded_out_.data(), wire_row, row,
                                         num_tokens * heads_per_rank(), cudaMemcpyDeviceToDevice,
                                         stream));
  return absl::OkStatus();
}

template absl::Status CudaDcpExchange::Exchange<__nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                               cudaStream_t);
template absl::Status CudaDcpExchange::Exchange<__half>(const __half*, int64_t, cudaStream_t);

}  // namespace tandem::runtime::cuda
