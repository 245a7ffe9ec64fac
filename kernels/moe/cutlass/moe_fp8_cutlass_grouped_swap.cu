// The scaled form with the operands swapped (moe_fp8_cutlass_grouped_scaled.cuh): the weight as
// the 128-row operand, a group's rows as a 32-wide one, for groups of few rows (decode).
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_scaled.cuh"

namespace tandem::kernels::cuda::moe_cutlass {

size_t SwapWorkspaceBytes(int64_t groups, int device, int sm_count) {
  return ScaledForm<true>::WorkspaceBytes(groups, device, sm_count);
}
absl::Status SwapInit() { return ScaledForm<true>::Init(); }
absl::Status SwapRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                     int sm_count, cudaStream_t stream) {
  return ScaledForm<true>::Run(args, workspace, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
