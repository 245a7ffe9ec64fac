// The weight scales per 128 x 128 block (ScaleGranularityN 128): the upload's block scales
// [ceil(n / 128), ld] per expert, read in place where ld = k / 128, else from a compact copy
// (moe_fp8_cutlass_grouped_kernel.cuh). One scale per weight tile and k step instead of 128.
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {
namespace {

using Config = GroupedConfig<128>;

}  // namespace

size_t BlockWorkspaceBytes(int64_t groups, int device, int sm_count) {
  return WorkspaceBytes<Config>(groups, device, sm_count);
}
absl::Status BlockInit() { return Init<Config>(); }
absl::Status BlockRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, float* compact,
                      int device, int sm_count, cudaStream_t stream) {
  return Run<Config>(args, workspace, compact, device, sm_count, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass
