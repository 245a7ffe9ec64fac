// Pack: a grid-stride loop over the 16-byte vectors of out (then the lse values); each finds its
// (token, head), hence its destination region and offset, and copies. Merge: MergeAttnStatesN
// over the receive buffer's regions.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/cuda/merge_attn_states_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::Vec;

constexpr int kThreads = 256;

// Sizes the kernel needs, in elements / vectors / bytes.
struct PackGeometry {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t heads_per_rank;
  int64_t vecs_per_row;  // head_dim / (16 / sizeof(T))
  int64_t region_bytes;
  int64_t lse_offset;
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    PackKernel(const T* __restrict__ out, const float* __restrict__ lse, PackGeometry g,
               unsigned char* __restrict__ send) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t rows = g.num_tokens * g.num_heads;
  const int64_t vecs = rows * g.vecs_per_row;
  const int64_t total = vecs + rows;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const bool is_vec = i < vecs;
    const int64_t row = is_vec ? i / g.vecs_per_row : i - vecs;  // token * num_heads + head
    const int64_t t = row / g.num_heads, h = row % g.num_heads;
    const int64_t dst_rank = h / g.heads_per_rank;
    const int64_t dst_row = t * g.heads_per_rank + h % g.heads_per_rank;  // within the region
    unsigned char* region = send + dst_rank * g.region_bytes;
    if (is_vec) {
      const int64_t v = i % g.vecs_per_row;
      *reinterpret_cast<Vec<T, kVec>*>(region + (dst_row * g.vecs_per_row + v) * 16) =
          *reinterpret_cast<const Vec<T, kVec>*>(out + (row * g.vecs_per_row + v) * kVec);
    } else {
      reinterpret_cast<float*>(region + g.lse_offset)[dst_row] = lse[row];
    }
  }
}

template <typename T>
absl::Status CheckLayout(const char* op, const DcpExchangeLayout& layout) {
  if (absl::Status s = layout.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", s.message()));
  }
  if (layout.elem_bytes != static_cast<int64_t>(sizeof(T))) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": layout.elem_bytes ", layout.elem_bytes, " != sizeof(T) ", sizeof(T)));
  }
  if (layout.head_dim * layout.elem_bytes % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": head_dim ", layout.head_dim, " x ",
                                                   layout.elem_bytes,
                                                   " bytes is not a multiple of 16"));
  }
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
absl::Status DcpPackForExchange(const T* out, const float* lse, const DcpExchangeLayout& layout,
                                void* send, cudaStream_t stream) {
  constexpr const char* kOp = "cuda::DcpPackForExchange";
  if (absl::Status s = CheckLayout<T>(kOp, layout); !s.ok()) return s;
  if (layout.num_tokens == 0) return absl::OkStatus();
  if (out == nullptr || lse == nullptr || send == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": null pointer"));
  }
  if (!Aligned16(out) || !Aligned16(send)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out and send must be 16-byte aligned"));
  }
  const PackGeometry g{layout.num_tokens,     layout.num_heads,
                       layout.HeadsPerRank(), layout.head_dim * layout.elem_bytes / 16,
                       layout.RegionBytes(),  layout.LseOffset()};
  const int64_t total = layout.num_tokens * layout.num_heads * (g.vecs_per_row + 1);
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 4096);
  PackKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      out, lse, g, static_cast<unsigned char*>(send));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status DcpMergeReceived(const void* recv, const DcpExchangeLayout& layout, T* out, float* lse,
                              cudaStream_t stream) {
  constexpr const char* kOp = "cuda::DcpMergeReceived";
  if (absl::Status s = CheckLayout<T>(kOp, layout); !s.ok()) return s;
  if (layout.num_tokens == 0) return absl::OkStatus();
  if (recv == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": null pointer"));
  }
  if (!Aligned16(recv)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": recv must be 16-byte aligned"));
  }
  return MergeAttnStatesN<T>(DcpReceivedPartials<T>(recv, layout), layout.num_tokens,
                             layout.HeadsPerRank(), layout.head_dim, out, lse, stream);
}

template absl::Status DcpPackForExchange<float>(const float*, const float*,
                                                const DcpExchangeLayout&, void*, cudaStream_t);
template absl::Status DcpPackForExchange<__nv_bfloat16>(const __nv_bfloat16*, const float*,
                                                        const DcpExchangeLayout&, void*,
                                                        cudaStream_t);
template absl::Status DcpPackForExchange<__half>(const __half*, const float*,
                                                 const DcpExchangeLayout&, void*, cudaStream_t);
template absl::Status DcpMergeReceived<float>(const void*, const DcpExchangeLayout&, float*, float*,
                                              cudaStream_t);
template absl::Status DcpMergeReceived<__nv_bfloat16>(const void*, const DcpExchangeLayout&,
                                                      __nv_bfloat16*, float*, cudaStream_t);
template absl::Status DcpMergeReceived<__half>(const void*, const DcpExchangeLayout&, __half*,
                                               float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
