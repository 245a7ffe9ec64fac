#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/sampling/cuda/shard_argmax_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ ShardCandidate ShuffleXor(const ShardCandidate& c, int offset) {
  ShardCandidate o;
  o.value = __shfl_xor_sync(0xffffffffu, c.value, offset);
  o.id = __shfl_xor_sync(0xffffffffu, c.id, offset);
  return o;
}

// One block per row: each thread its strided columns, then a warp and a block reduction under
// Beats (a total order, so the grouping does not change the result).
__global__ void __launch_bounds__(kThreads)
    ShardArgmaxKernel(const float* logits, int64_t cols, int64_t first_id, int64_t vocab,
                      const DeviceSamplingRow* rows, ShardCandidate* out) {
  __shared__ ShardCandidate warp_best[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t limit = ShardSampledLimit(vocab, rows[r].vocab_limit);
  const int64_t end = limit - first_id < cols ? limit - first_id : cols;
  const float* row = logits + r * cols;
  ShardCandidate best{0.0f, -1};
  for (int64_t c = threadIdx.x; c < end; c += kThreads) {
    const float v = row[c];
    if (v != v) continue;  // NaN never wins
    const ShardCandidate mine{v, static_cast<int32_t>(first_id + c)};
    if (Beats(mine, best)) best = mine;
  }
  for (int o = 16; o > 0; o /= 2) {
    const ShardCandidate other = ShuffleXor(best, o);
    if (Beats(other, best)) best = other;
  }
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (Beats(warp_best[w], best)) best = warp_best[w];
    }
    out[r] = best;
  }
}

__global__ void PickKernel(const ShardCandidate* candidates, int num_ranks, int64_t num_rows,
                           int32_t* out) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= num_rows) return;
  ShardCandidate best{0.0f, -1};
  for (int k = 0; k < num_ranks; ++k) {
    const ShardCandidate c = candidates[k * num_rows + r];
    if (Beats(c, best)) best = c;
  }
  out[r] = best.id < 0 ? 0 : best.id;
}

}  // namespace

absl::Status ShardArgmaxRows(const float* logits, int64_t num_rows, int64_t cols, int64_t first_id,
                             int64_t vocab, const DeviceSamplingRow* rows, ShardCandidate* out,
                             cudaStream_t stream) {
  if (num_rows < 0 || cols < 0 || first_id < 0 || vocab < 1 || num_rows > 0x7fffffff ||
      vocab > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::ShardArgmaxRows: bad shape ", num_rows,
                                                   " x ", cols, " of vocab ", vocab));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (logits == nullptr || rows == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("cuda::ShardArgmaxRows: null pointer");
  }
  ShardArgmaxKernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(
      logits, cols, first_id, vocab, rows, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status PickShardCandidates(const ShardCandidate* candidates, int num_ranks, int64_t num_rows,
                                 int32_t* out, cudaStream_t stream) {
  if (num_ranks < 1 || num_rows < 0) {
    return absl::InvalidArgumentError("cuda::PickShardCandidates: bad shape");
  }
  if (num_rows == 0) return absl::OkStatus();
  if (candidates == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("cuda::PickShardCandidates: null pointer");
  }
  const int64_t blocks = (num_rows + 127) / 128;
  PickKernel<<<static_cast<unsigned>(blocks), 128, 0, stream>>>(candidates, num_ranks, num_rows,
                                                                out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
