// Expert parallelism over the TP ranks on the device (runtime/model/tensor_parallel.h): the
// "prepare" half around the unchanged expert kernels of moe_cuda.h. After MoeRoute every rank
// holds the group's routing (global expert ids); MoeLocalizeRouting turns it into this rank's:
//   ids[p]     = slot_of_expert[ids[p]]  where this rank holds the expert (its local slot),
//                num_local               otherwise (one extra bucket: an all-zero expert),
//   weights[p] = weights[p] or 0         alike,
// and adds each pair's GLOBAL expert to `global_load` ([E] int64, device; null: not counted).
// The caller then permutes over num_local + 1 experts: the extra bucket's rows meet zero weights
// (their output is exactly 0) and a zero combine weight, so every path (GEMV, padded, grouped)
// and the combine stay as they are, sync-free and capturable. The row-parallel all-reduce after
// the MLP sums the ranks' parts.
//
// Thread safety: enqueues on `stream`; no state.
#ifndef TANDEM_KERNELS_MOE_MOE_EP_CUDA_H_
#define TANDEM_KERNELS_MOE_MOE_EP_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// ids, weights: [num_pairs] (device, in place); slot_of_expert: [num_experts] int32 (device), -1
// for experts other ranks hold. INVALID_ARGUMENT for num_local < 0 or num_experts < 1.
absl::Status MoeLocalizeRouting(int32_t* ids, float* weights, int64_t num_pairs,
                                const int32_t* slot_of_expert, int64_t num_experts,
                                int64_t num_local, int64_t* global_load, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_EP_CUDA_H_
