// The scaled form in the rows-first order (moe_fp8_cutlass_grouped_scaled.cuh): 128 x 128 x 128
// tiles, clusters of 1 x 2, for groups of many rows.
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_scaled.cuh"

namespace tandem::kernels::cuda::moe_cutlass {

size_t ScaledWorkspaceBytes(int64_t groups, int device, int sm_count) {
  return ScaledForm<false>::WorkspaceBytes(groups, device, sm_count);
}
absl::Status ScaledInit() { return ScaledForm<false>::Init(); }
absl::Status ScaledRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                       int sm_count, cudaStream_t stream) {
  return ScaledForm<false>::Run(args, workspace, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
