// The block form with its operands swapped (BlockSwapConfig, moe_fp8_cutlass_grouped_kernel.cuh):
// the weight and its 128 x 128 block scales first, a group's rows in 32-wide tiles, for groups of
// few rows (decode).
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {

size_t BlockSwapWorkspaceBytes(int64_t groups, int device, int sm_count) {
  return WorkspaceBytes<BlockSwapConfig>(groups, device, sm_count);
}
absl::Status BlockSwapInit() { return Init<BlockSwapConfig>(); }
absl::Status BlockSwapRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, float* compact,
                          int device, int sm_count, cudaStream_t stream) {
  return Run<BlockSwapConfig>(args, workspace, compact, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
