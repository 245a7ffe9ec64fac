// Greedy sampling over vocab-parallel logits on the device (kernels/sampling/shard_argmax.h):
// each rank reduces its rows of every logit row to one candidate (value, id); after an
// all-gather of those 8-byte candidates every rank picks the same token, exactly the whole
// row's greedy choice (SampleTokens with temperature 0). Asynchronous on `stream`,
// graph-capturable (fixed grids, no allocation).
#ifndef TANDEM_KERNELS_SAMPLING_CUDA_SHARD_ARGMAX_CUDA_H_
#define TANDEM_KERNELS_SAMPLING_CUDA_SHARD_ARGMAX_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "kernels/sampling/shard_argmax.h"

namespace tandem::kernels::cuda {

// out[r] = ShardArgmax of row r: logits [num_rows, cols] fp32 (device) hold ids first_id ..
// first_id + cols - 1 of a `vocab`-id row; ids at or past ShardSampledLimit(vocab,
// rows[r].vocab_limit) are skipped. out: [num_rows] (device). INVALID_ARGUMENT (nothing
// launched) for negative sizes or null pointers; num_rows == 0: nothing launched.
absl::Status ShardArgmaxRows(const float* logits, int64_t num_rows, int64_t cols, int64_t first_id,
                             int64_t vocab, const DeviceSamplingRow* rows, ShardCandidate* out,
                             cudaStream_t stream);

// out[r] = PickShardCandidate over candidates[k * num_rows + r] for k in [0, num_ranks) (the
// all-gathered candidates, rank-major). out: [num_rows] int32 (device).
absl::Status PickShardCandidates(const ShardCandidate* candidates, int num_ranks, int64_t num_rows,
                                 int32_t* out, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_SAMPLING_CUDA_SHARD_ARGMAX_CUDA_H_
