// CutlassBlockTile::kPingpong64: 64 x 128 x 128 tiles, no cluster, the ping-pong
// warp-specialized block-FP8 kernel (cutlass_block_gemm_kernel.cuh).
#include "kernels/fp8/cutlass/cutlass_block_gemm_kernel.cuh"

namespace tandem::kernels::cuda::cutlass_block {
namespace {

using Config = BlockGemmConfig<cute::Shape<cute::_64, cute::_128, cute::_128>,
                               cute::Shape<cute::_1, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                               cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace

size_t Pingpong64WorkspaceBytes(const Problem& p) { return WorkspaceBytes<Config>(p); }
absl::Status Pingpong64Init() { return Init<Config>(); }
absl::Status Pingpong64Run(const Problem& p, void* workspace, cudaStream_t stream) {
  return Run<Config>(p, workspace, stream);
}

}  // namespace tandem::kernels::cuda::cutlass_block
