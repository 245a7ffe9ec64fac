// Gather / scatter copies of NcclAgent's staging path (kvtransfer/nccl/nccl_agent_plan.h): copy a
// list of CopyTiles on the device. CUDA builds only.
//
// Two engines:
//  * LaunchCopyTiles: a kernel. Each CTA (512 threads) copies whole tiles, grid-striding over
//    the list; a one-row tile with all its threads; a tile of rows (CopyTile::rows > 1, the
//    head slices of a re-shard) as one flat list of 16-byte vectors over all its rows when
//    rows, starts and pitches are 16-byte multiples, else one row per warp; within a row it
//    uses 16-byte vectors when source
//    and destination share their address modulo 16 (8 / 4 / 1 bytes otherwise), with byte-wise head
//    and tail, so any offsets and lengths are correct. The grid is capped at `max_ctas` so NCCL's
//    own kernels, running at the same time on another stream, still find free SMs. `streaming`
//    marks its loads and stores evict-first (ld/st.global.cs): the copied lines leave L2 before
//    NCCL's.
//  * CopyTilesWithEngines: the DMA copy engines (one cudaMemcpyBatchAsync for the one-row tiles,
//    one cudaMemcpy2DAsync per tile of rows), no SMs at all.
//
// Thread safety: stateless; the usual CUDA stream semantics.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_COPY_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvtransfer/nccl/nccl_agent_plan.h"

namespace tandem::kvtransfer::nccl_copy {

// How a link moves bytes between the pool and its staging buffers.
enum class CopyMode {
  kKernel,           // LaunchCopyTiles, ordinary loads / stores
  kStreamingKernel,  // LaunchCopyTiles with streaming = true
  kCopyEngine,       // CopyTilesWithEngines
};

// Threads per CTA of the copy kernel.
inline constexpr int kCopyThreads = 512;

// Enqueues the copy of tiles[0..num_tiles) on `stream`. `tiles` is device memory (or host memory
// the device can read) and must stay valid until the kernel ran. Tiles must not overlap each
// other's destinations or their own source. Launches nothing for num_tiles == 0.
// cudaErrorInvalidValue for max_ctas < 1; otherwise the launch's error.
cudaError_t LaunchCopyTiles(const nccl_plan::CopyTile* tiles, uint32_t num_tiles, int max_ctas,
                            bool streaming, cudaStream_t stream);

// Enqueues the same copies on the copy engines. `tiles` is host memory, read during the call
// only. Same overlap rules; nothing for num_tiles == 0.
cudaError_t CopyTilesWithEngines(const nccl_plan::CopyTile* tiles, uint32_t num_tiles,
                                 cudaStream_t stream);

}  // namespace tandem::kvtransfer::nccl_copy

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_COPY_H_
