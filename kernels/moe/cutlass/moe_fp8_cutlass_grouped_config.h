// Internal to :moe_fp8_cutlass_grouped: the five configurations' entry points, each defined in its
// own .cu file (moe_fp8_cutlass_grouped_row.cu: weight scales per row, moe_fp8_cutlass_grouped_
// block.cu: per 128-row block, _block_swap.cu: the same swapped, from
// moe_fp8_cutlass_grouped_kernel.cuh;
// moe_fp8_cutlass_grouped_scaled.cu / _swap.cu: per-channel weight and per-token / per-tensor
// activation scales in the epilogue, rows first or weight first, from
// moe_fp8_cutlass_grouped_scaled.cuh), called by moe_fp8_cutlass_grouped.cu after it checked the
// call. No CUTLASS types here.
#ifndef TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_CONFIG_H_
#define TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_CONFIG_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"

namespace tandem::kernels::cuda::moe_cutlass {

// The per-group arrays and CUTLASS's own workspace for `groups` groups on `device` with
// `sm_count` SMs (0, 0: CUTLASS asks device 0); the block form's compact scale copy not included.
size_t RowWorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status RowInit();
// A checked call (args.block_scales null) with its workspace (128-byte aligned, at least
// RowWorkspaceBytes).
absl::Status RowRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device, int sm_count,
                    cudaStream_t stream);

size_t BlockWorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status BlockInit();
// A checked call (args.block_scales set). compact: null where args.block_scale_ld == k / 128
// (CUTLASS reads the experts' block scales in place), else room for [num_experts, ceil(n / 128),
// k / 128] floats, filled before the GEMM runs.
absl::Status BlockRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, float* compact,
                      int device, int sm_count, cudaStream_t stream);

// The scaled form (MoeFp8CutlassScaledFormServes(args)): no scale copies, no compact array; Swap*
// its swapped order (args.swap_ab, moe_fp8_cutlass_grouped_swap.cu).
size_t ScaledWorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status ScaledInit();
absl::Status ScaledRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                       int sm_count, cudaStream_t stream);
// The block form swapped (args.swap_ab with block scales, moe_fp8_cutlass_grouped_block_swap.cu):
// its compact copy as BlockRun's.
size_t BlockSwapWorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status BlockSwapInit();
absl::Status BlockSwapRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, float* compact,
                          int device, int sm_count, cudaStream_t stream);
// The swapped scaled form split along k (args.k_splits > 1, moe_fp8_cutlass_grouped_split.cu):
// its arrays for kMoeFp8CutlassMaxSplits groups and CUTLASS's workspace.
size_t SplitWorkspaceBytes(int device, int sm_count);
absl::Status SplitInit();
absl::Status SplitRun(const MoeFp8CutlassGroupedArgs& args, int64_t rows, char* workspace,
                      int device, int sm_count, cudaStream_t stream);
size_t SwapWorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status SwapInit();
absl::Status SwapRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                     int sm_count, cudaStream_t stream);
size_t Swap64WorkspaceBytes(int64_t groups, int device, int sm_count);
absl::Status Swap64Init();
absl::Status Swap64Run(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                       int sm_count, cudaStream_t stream);

}  // namespace tandem::kernels::cuda::moe_cutlass

#endif  // TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_CONFIG_H_
