// The swapped scaled form (moe_fp8_cutlass_grouped_scaled.cuh) with 64-row token tiles: one
// weight's 33-64 and 129-192 decode rows (MoeFp8CutlassGroupedArgs::swap_token_tile = 64).
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_scaled.cuh"

namespace tandem::kernels::cuda::moe_cutlass {

size_t Swap64WorkspaceBytes(int64_t groups, int device, int sm_count) {
  return ScaledForm<true, 64>::WorkspaceBytes(groups, device, sm_count);
}
absl::Status Swap64Init() { return ScaledForm<true, 64>::Init(); }
absl::Status Swap64Run(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                       int sm_count, cudaStream_t stream) {
  return ScaledForm<true, 64>::Run(args, workspace, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
