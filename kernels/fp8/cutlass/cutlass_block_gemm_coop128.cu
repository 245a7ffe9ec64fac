// CutlassBlockTile::kCooperative128: 128 x 128 x 128 tiles, clusters of 1 x 2, the cooperative
// warp-specialized block-FP8 kernel (cutlass_block_gemm_kernel.cuh).
#include "kernels/fp8/cutlass/cutlass_block_gemm_kernel.cuh"

namespace tandem::kernels::cuda::cutlass_block {
namespace {

using Config = BlockGemmConfig<cute::Shape<cute::_128, cute::_128, cute::_128>,
                               cute::Shape<cute::_1, cute::_2, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;

}  // namespace

size_t Cooperative128WorkspaceBytes(const Problem& p) { return WorkspaceBytes<Config>(p); }
absl::Status Cooperative128Init() { return Init<Config>(); }
absl::Status Cooperative128Run(const Problem& p, void* workspace, cudaStream_t stream) {
  return Run<Config>(p, workspace, stream);
}

}  // namespace tandem::kernels::cuda::cutlass_block
