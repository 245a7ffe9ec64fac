// The weight scales per row (ScaleGranularityN 1): the loader's [n, k / 128] per expert, read in
// place (moe_fp8_cutlass_grouped_kernel.cuh).
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {
namespace {

using Config = GroupedConfig<1>;

}  // namespace

size_t RowWorkspaceBytes(int64_t groups, int device, int sm_count) {
  return WorkspaceBytes<Config>(groups, device, sm_count);
}
absl::Status RowInit() { return Init<Config>(); }
absl::Status RowRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device, int sm_count,
                    cudaStream_t stream) {
  return Run<Config>(args, workspace, nullptr, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
