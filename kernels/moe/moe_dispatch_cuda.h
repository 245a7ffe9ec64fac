// Wide expert parallelism's dispatch and combine kernels (DP attention + EP:
// runtime/cuda/cuda_moe_all_to_all.h): the device twins of moe_dispatch.h's reference, around
// the all-to-alls that move the rows. Per MoE layer on a rank with T tokens of its own:
//
//   MoePlanDispatch    routing ids [T, k] -> pos [T, N] (token t's row among those sent to rank
//                      d, token order, -1: none) and counts [N] (rows to each rank); one block;
//                      adds each pair's GLOBAL expert to the load counters;
//   MoeDispatchPack    the send buffer [sum counts, W]: the rows to rank 0, then rank 1, ...;
//                      row = x[t] | k slots on the destination (-1: another rank's) | k weights;
//   (all-to-all)       the rows travel; rows for this rank arrive from ranks 0..N-1 in order;
//   MoeDispatchUnpack  received rows [R, W] -> x [R, H], ids [R, k] (slot, or `zero_slot` for -1),
//                      weights [R, k] (0 for -1): a routing of this rank's experts + a zero expert
//                      (moe_ep_cuda.h's convention), for the unchanged expert kernels;
//   (experts, all-to-all back: one row per received row, the weighted sum of its experts)
//   MoeDispatchCombine out[t] = round(sum over d in rank order of back[off(d) + pos[t, d]]
//                      + g_t * shared[t]) in fp32, g_t = sigmoid(x[t] . shared_gate) when gated.
//
// W = MoeDispatchRowWidth(H, k) elements of T (2 bytes): x, then int32 slots and fp32 weights at
// byte 2H and 2H + 4k. Launch sizes depend on host values only (T, R, N); none syncs the host.
//
// The fixed layout (capacity C > 0, for CUDA graphs: moe_dispatch.h's MoeDispatchFixedRows):
// the rows to rank d sit at [d * C, d * C + counts[d]) and Pack fills the rest of [d * C, (d+1) *
// C) with padding rows (x zero, every slot -1: the receiver's zero expert with weight 0), so one
// all-to-all of C rows per pair moves them and the receiver unpacks N * C rows without knowing
// the counts; Combine reads rank d's rows from d * C. Needs T <= C.
//
// Thread safety: stateless; asynchronous on `stream`.
#ifndef TANDEM_KERNELS_MOE_MOE_DISPATCH_CUDA_H_
#define TANDEM_KERNELS_MOE_MOE_DISPATCH_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe/moe_dispatch.h"

namespace tandem::kernels::cuda {

// expert_ids [T, k] (global ids in [0, E)); rank_of_expert [E]; pos [T, N] and counts [N] int32
// out (counts written for T = 0 too); load [E] int64 added to, or null. All device pointers.
// INVALID_ARGUMENT for N outside [1, kMoeDispatchMaxRanks], k < 1 or T < 0.
absl::Status MoePlanDispatch(const int32_t* expert_ids, int64_t num_tokens, int64_t top_k,
                             const int32_t* rank_of_expert, int num_ranks, int32_t* pos,
                             int32_t* counts, int64_t* load, cudaStream_t stream);

// send [sum counts, W]: each (t, d) with pos[t, d] >= 0 as row prefix(counts)[d] + pos[t, d].
// x [T, H] (16-byte aligned, H % 8 == 0); ids / weights [T, k]; slot_in_owner [E].
// capacity > 0: the fixed layout, send [N * capacity, W] (padding written; T = 0 allowed).
template <typename T>
absl::Status MoeDispatchPack(const T* x, int64_t num_tokens, int64_t hidden,
                             const int32_t* expert_ids, const float* weights, int64_t top_k,
                             const int32_t* rank_of_expert, const int32_t* slot_in_owner,
                             const int32_t* pos, const int32_t* counts, int num_ranks, T* send,
                             cudaStream_t stream, int64_t capacity = 0);

// recv [R, W] -> x [R, H], ids [R, k], weights [R, k] (see the header comment).
template <typename T>
absl::Status MoeDispatchUnpack(const T* recv, int64_t rows, int64_t hidden, int64_t top_k,
                               int32_t zero_slot, T* x, int32_t* ids, float* weights,
                               cudaStream_t stream);

// back [sum counts, H]: the rows returned, in send order ([N * capacity, H] in the fixed
// layout). shared [T, H] or null; shared_gate [H] or null (then g = 1); x [T, H] (read for the
// gate only; may alias out).
template <typename T>
absl::Status MoeDispatchCombine(const T* back, const int32_t* pos, const int32_t* counts,
                                int num_ranks, int64_t num_tokens, int64_t hidden, const T* shared,
                                const T* shared_gate, const T* x, T* out, cudaStream_t stream,
                                int64_t capacity = 0);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_DISPATCH_CUDA_H_
