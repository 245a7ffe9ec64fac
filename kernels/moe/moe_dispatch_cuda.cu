// MoePlanDispatch, MoeDispatchPack / Unpack / Combine (moe_dispatch_cuda.h).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_dispatch_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;
constexpr int kRowThreads = 128;

// One block walks the tokens in chunks of kPlanThreads, a thread per token: its mask of
// destination ranks, then per rank a ballot gives the token's place within its warp, the warps
// before it (shared counts) and the chunks before (running) its row: token order, no atomics.
__global__ void __launch_bounds__(kPlanThreads)
    PlanKernel(const int32_t* __restrict__ ids, int64_t num_tokens, int top_k,
               const int32_t* __restrict__ rank_of, int n, int32_t* __restrict__ pos,
               int32_t* __restrict__ counts, unsigned long long* load) {
  __shared__ int32_t warp_counts[kMoeDispatchMaxRanks][kPlanWarps];
  __shared__ int32_t running[kMoeDispatchMaxRanks];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < n) running[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t base = 0; base < num_tokens; base += kPlanThreads) {
    const int64_t t = base + threadIdx.x;
    uint32_t mask = 0;
    if (t < num_tokens) {
      for (int j = 0; j < top_k; ++j) {
        const int32_t e = ids[t * top_k + j];
        mask |= 1u << rank_of[e];
        if (load != nullptr) atomicAdd(load + e, 1ull);
      }
    }
    for (int d = 0; d < n; ++d) {
      const unsigned ballot = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (lane == 0) warp_counts[d][warp] = __popc(ballot);
    }
    __syncthreads();
    for (int d = 0; d < n; ++d) {
      const unsigned ballot = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      int32_t before = running[d];
      for (int w = 0; w < warp; ++w) before += warp_counts[d][w];
      if (t < num_tokens) {
        pos[t * n + d] = (mask >> d) & 1u ? before + __popc(ballot & ((1u << lane) - 1u)) : -1;
      }
    }
    __syncthreads();  // every thread has read running / warp_counts of this chunk
    if (threadIdx.x < n) {
      int32_t total = 0;
      for (int w = 0; w < kPlanWarps; ++w) total += warp_counts[threadIdx.x][w];
      running[threadIdx.x] += total;
    }
    __syncthreads();
  }
  if (threadIdx.x < n) counts[threadIdx.x] = running[threadIdx.x];
}

// Where each rank's rows start (shared), by thread 0: the exclusive prefix of counts, or d *
// capacity in the fixed layout (capacity > 0).
__device__ __forceinline__ void RankOffsets(const int32_t* counts, int n, int64_t capacity,
                                            int64_t* offsets) {
  if (threadIdx.x == 0) {
    int64_t at = 0;
    for (int d = 0; d < n; ++d) {
      offsets[d] = capacity > 0 ? d * capacity : at;
      at += counts[d];
    }
  }
  __syncthreads();
}

// A row's x part: hidden elements as 16-byte vectors (hidden % 8 == 0, rows 16-byte aligned).
template <typename T>
__device__ __forceinline__ void CopyRow(const T* src, T* dst, int64_t hidden) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* o = reinterpret_cast<uint4*>(dst);
  for (int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) o[i] = s[i];
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    PackKernel(const T* __restrict__ x, int64_t hidden, int64_t width,
               const int32_t* __restrict__ ids, const float* __restrict__ weights, int top_k,
               const int32_t* __restrict__ rank_of, const int32_t* __restrict__ slot_in_owner,
               const int32_t* __restrict__ pos, const int32_t* __restrict__ counts, int n,
               int64_t num_tokens, int64_t capacity, T* __restrict__ send) {
  __shared__ int64_t offsets[kMoeDispatchMaxRanks];
  RankOffsets(counts, n, capacity, offsets);
  const int64_t t = blockIdx.x;
  // The fixed layout: block b also fills row b of every rank whose real rows end before it with
  // padding (x zero, every slot -1, weight 0: the receiver's zero expert, never read back).
  for (int d = 0; d < n && capacity > 0; ++d) {
    if (t < counts[d] || t >= capacity) continue;
    T* row = send + (offsets[d] + t) * width;
    uint4* o = reinterpret_cast<uint4*>(row);
    for (int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) o[i] = make_uint4(0, 0, 0, 0);
    if (threadIdx.x < top_k) {
      int32_t* slots = reinterpret_cast<int32_t*>(row + hidden);
      slots[threadIdx.x] = -1;
      reinterpret_cast<float*>(slots + top_k)[threadIdx.x] = 0.0f;
    }
  }
  for (int d = 0; d < n && t < num_tokens; ++d) {
    const int32_t p = pos[t * n + d];
    if (p < 0) continue;
    T* row = send + (offsets[d] + p) * width;
    CopyRow(x + t * hidden, row, hidden);
    if (threadIdx.x < top_k) {
      const int j = threadIdx.x;
      const int32_t e = ids[t * top_k + j];
      const bool here = rank_of[e] == d;
      int32_t* slots = reinterpret_cast<int32_t*>(row + hidden);
      slots[j] = here ? slot_in_owner[e] : -1;
      reinterpret_cast<float*>(slots + top_k)[j] = here ? weights[t * top_k + j] : 0.0f;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    UnpackKernel(const T* __restrict__ recv, int64_t hidden, int64_t width, int top_k,
                 int32_t zero_slot, T* __restrict__ x, int32_t* __restrict__ ids,
                 float* __restrict__ weights) {
  const int64_t r = blockIdx.x;
  const T* row = recv + r * width;
  CopyRow(row, x + r * hidden, hidden);
  if (threadIdx.x < top_k) {
    const int j = threadIdx.x;
    const int32_t* slots = reinterpret_cast<const int32_t*>(row + hidden);
    const int32_t slot = slots[j];
    // A slot past this rank's experts cannot come from a sender of the same placement; the zero
    // expert keeps it harmless.
    const bool valid = slot >= 0 && slot < zero_slot;
    ids[r * top_k + j] = valid ? slot : zero_slot;
    weights[r * top_k + j] = valid ? reinterpret_cast<const float*>(slots + top_k)[j] : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    CombineKernel(const T* __restrict__ back, const int32_t* __restrict__ pos,
                  const int32_t* __restrict__ counts, int n, int64_t capacity, int64_t hidden,
                  const T* __restrict__ shared, const T* __restrict__ shared_gate, const T* x,
                  T* out) {
  __shared__ int64_t offsets[kMoeDispatchMaxRanks];
  __shared__ float red[kRowThreads / 32];
  __shared__ int64_t row_of[kMoeDispatchMaxRanks];
  RankOffsets(counts, n, capacity, offsets);
  const int64_t t = blockIdx.x;
  if (threadIdx.x < n) {
    const int32_t p = pos[t * n + threadIdx.x];
    row_of[threadIdx.x] = p < 0 ? -1 : offsets[threadIdx.x] + p;
  }
  float gate = 1.0f;
  if (shared != nullptr && shared_gate != nullptr) {
    float dot = 0.0f;
    for (int64_t h = threadIdx.x; h < hidden; h += kRowThreads) {
      dot = fmaf(ToFloat(x[t * hidden + h]), ToFloat(shared_gate[h]), dot);
    }
    gate = 1.0f / (1.0f + expf(-BlockSum<kRowThreads>(dot, red)));
  }
  __syncthreads();  // row_of written; x (may alias out) fully read before any write
  for (int64_t h = threadIdx.x; h < hidden; h += kRowThreads) {
    float acc = 0.0f;
    for (int d = 0; d < n; ++d) {
      if (row_of[d] >= 0) acc += ToFloat(back[row_of[d] * hidden + h]);
    }
    if (shared != nullptr) acc = fmaf(gate, ToFloat(shared[t * hidden + h]), acc);
    out[t * hidden + h] = FromFloat<T>(acc);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status CheckRows(const char* what, int64_t hidden, int64_t top_k, const void* a,
                       const void* b) {
  if (hidden < 8 || hidden % 8 != 0 || top_k < 1 || top_k > kRowThreads || !Aligned16(a) ||
      !Aligned16(b)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": hidden ", hidden,
                                                   " (a multiple of 8), top_k ", top_k,
                                                   " (1..128), 16-byte aligned rows"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoePlanDispatch(const int32_t* expert_ids, int64_t num_tokens, int64_t top_k,
                             const int32_t* rank_of_expert, int num_ranks, int32_t* pos,
                             int32_t* counts, int64_t* load, cudaStream_t stream) {
  if (num_ranks < 1 || num_ranks > kMoeDispatchMaxRanks || top_k < 1 || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MoePlanDispatch: ", num_tokens, " tokens, top-",
                                                   top_k, ", ", num_ranks, " ranks (1..",
                                                   kMoeDispatchMaxRanks, ")"));
  }
  static_assert(sizeof(unsigned long long) == sizeof(int64_t));
  PlanKernel<<<1, kPlanThreads, 0, stream>>>(expert_ids, num_tokens, static_cast<int>(top_k),
                                             rank_of_expert, num_ranks, pos, counts,
                                             reinterpret_cast<unsigned long long*>(load));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeDispatchPack(const T* x, int64_t num_tokens, int64_t hidden,
                             const int32_t* expert_ids, const float* weights, int64_t top_k,
                             const int32_t* rank_of_expert, const int32_t* slot_in_owner,
                             const int32_t* pos, const int32_t* counts, int num_ranks, T* send,
                             cudaStream_t stream, int64_t capacity) {
  const int64_t blocks = std::max(num_tokens, capacity);
  if (blocks == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckRows("MoeDispatchPack", hidden, top_k, num_tokens > 0 ? x : send, send));
  if (num_ranks < 1 || num_ranks > kMoeDispatchMaxRanks || num_tokens < 0 ||
      (capacity > 0 && num_tokens > capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("MoeDispatchPack: ", num_tokens, " tokens, ",
                                                   num_ranks, " ranks, capacity ", capacity));
  }
  PackKernel<T><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
      x, hidden, MoeDispatchRowWidth(hidden, top_k), expert_ids, weights, static_cast<int>(top_k),
      rank_of_expert, slot_in_owner, pos, counts, num_ranks, num_tokens,
      std::max<int64_t>(capacity, 0), send);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeDispatchUnpack(const T* recv, int64_t rows, int64_t hidden, int64_t top_k,
                               int32_t zero_slot, T* x, int32_t* ids, float* weights,
                               cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckRows("MoeDispatchUnpack", hidden, top_k, recv, x));
  if (rows < 0 || zero_slot < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeDispatchUnpack: ", rows, " rows, zero slot ", zero_slot));
  }
  UnpackKernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      recv, hidden, MoeDispatchRowWidth(hidden, top_k), static_cast<int>(top_k), zero_slot, x, ids,
      weights);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeDispatchCombine(const T* back, const int32_t* pos, const int32_t* counts,
                                int num_ranks, int64_t num_tokens, int64_t hidden, const T* shared,
                                const T* shared_gate, const T* x, T* out, cudaStream_t stream,
                                int64_t capacity) {
  if (num_tokens == 0) return absl::OkStatus();
  if (num_ranks < 1 || num_ranks > kMoeDispatchMaxRanks || num_tokens < 0 || hidden < 1 ||
      (capacity > 0 && num_tokens > capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("MoeDispatchCombine: ", num_tokens,
                                                   " tokens, hidden ", hidden, ", ", num_ranks,
                                                   " ranks, capacity ", capacity));
  }
  CombineKernel<T><<<static_cast<unsigned>(num_tokens), kRowThreads, 0, stream>>>(
      back, pos, counts, num_ranks, std::max<int64_t>(capacity, 0), hidden, shared, shared_gate, x,
      out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

#define TANDEM_MOE_DISPATCH_INSTANTIATE(T)                                                        \
  template absl::Status MoeDispatchPack<T>(                                                       \
      const T*, int64_t, int64_t, const int32_t*, const float*, int64_t, const int32_t*,          \
      const int32_t*, const int32_t*, const int32_t*, int, T*, cudaStream_t, int64_t);            \
  template absl::Status MoeDispatchUnpack<T>(const T*, int64_t, int64_t, int64_t, int32_t, T*,    \
                                             int32_t*, float*, cudaStream_t);                     \
  template absl::Status MoeDispatchCombine<T>(const T*, const int32_t*, const int32_t*, int,      \
                                              int64_t, int64_t, const T*, const T*, const T*, T*, \
                                              cudaStream_t, int64_t);
TANDEM_MOE_DISPATCH_INSTANTIATE(__nv_bfloat16)
TANDEM_MOE_DISPATCH_INSTANTIATE(__half)
#undef TANDEM_MOE_DISPATCH_INSTANTIATE

}  // namespace tandem::kernels::cuda
