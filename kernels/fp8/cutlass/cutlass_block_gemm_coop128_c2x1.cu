// CutlassBlockTile::kCooperative128Cluster2x1: 128 x 128 x 128 tiles, clusters of 2 x 1 (the
// weight tile multicast to two m-tiles), the cooperative warp-specialized block-FP8 kernel
// (cutlass_block_gemm_kernel.cuh).
#include "kernels/fp8/cutlass/cutlass_block_gemm_kernel.cuh"

namespace tandem::kernels::cuda::cutlass_block {
namespace {

using Config = BlockGemmConfig<cute::Shape<cute::_128, cute::_128, cute::_128>,
                               cute::Shape<cute::_2, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;

}  // namespace

size_t Cooperative128Cluster2x1WorkspaceBytes(const Problem& p) {
  return WorkspaceBytes<Config>(p);
}
absl::Status Cooperative128Cluster2x1Init() { return Init<Config>(); }
absl::Status Cooperative128Cluster2x1Run(const Problem& p, void* workspace, cudaStream_t stream) {
  return Run<Config>(p, workspace, stream);
}

}  // namespace tandem::kernels::cuda::cutlass_block
