// CutlassBlockTile::kCooperative128StreamK: kCooperative128's kernel (128 x 128 x 128 tiles,
// clusters of 1 x 2, cooperative) on CUTLASS's Stream-K tile scheduler: the heuristic splits the
// tiles of a partial last wave along k (deterministic reduction through the workspace), for
// shapes of few waves (cutlass_block_gemm_kernel.cuh).
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "kernels/fp8/cutlass/cutlass_block_gemm_kernel.cuh"

namespace tandem::kernels::cuda::cutlass_block {
namespace {

using Config = BlockGemmConfig<
    cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_2, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
    cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler>;

}  // namespace

size_t Cooperative128StreamKWorkspaceBytes(const Problem& p) { return WorkspaceBytes<Config>(p); }
absl::Status Cooperative128StreamKInit() { return Init<Config>(); }
absl::Status Cooperative128StreamKRun(const Problem& p, void* workspace, cudaStream_t stream) {
  return Run<Config>(p, workspace, stream);
}

}  // namespace tandem::kernels::cuda::cutlass_block
