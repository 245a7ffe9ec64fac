// The TMA loading of the Hopper latent kernels (include from .cu only): mla_decode_tma.cu (one
// warpgroup scores every tile) and mla_decode_seesaw.cu (the two warpgroups score alternate
// tiles). The pool viewed as a [rows][576] tensor map, one box per page run and 64-column chunk,
// swizzled by the copy engine; each chunk of a stage has its own "full" mbarrier (expect-tx 8 KiB),
// so the score wgmma of chunk c starts when chunk c lands. Shared-memory plan of both kernels: Q
// (72 KiB), two latent stages (72 KiB each), P (8 KiB), 1 KiB of per-thread floats, the barriers.
#ifndef TANDEM_KERNELS_MLA_MLA_TMA_CUH_
#define TANDEM_KERNELS_MLA_MLA_TMA_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_phase_stamps.h"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal::tma_kernel {

inline constexpr int kD = 576, kRows = 64, kKeys = 64, kChunks = kD / 64;
constexpr int kBlockBytes = 64 * 128;              // one 64-column chunk of 64 rows (8 KiB)
constexpr int kTileBytes = kChunks * kBlockBytes;  // Q, or one latent stage: 72 KiB
constexpr int kPOff = 3 * kTileBytes;              // P: [4 k16 steps][128 threads] uint4
constexpr int kFOff = kPOff + 4 * 128 * 16;        // per-thread floats: [128 threads] float2
constexpr int kBarOff = kFOff + 128 * 8;           // full barriers: [2 stages][9 chunks]
constexpr int kSmemBytes = kBarOff + 2 * kChunks * 8 + 1024;  // + slack for 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
inline constexpr int kIssueWarp = 4;  // warp 0 of warpgroup 1 loads the first tiles

// Where the pool's rows are for the tensor map ([total rows][576], row = latent of one page slot
// of one layer): block b's slot k of `layer` is row b * rows_per_block + layer_row + k.
struct TmaGeometry {
  int rows_per_block;  // num_layers * block_size
  int layer_row;       // layer * block_size
  int box_rows;        // min(block_size, 64): a box never crosses a page
};

__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// TMA: the box at (column col, row row) of the tensor map into shared memory at dst, completing
// its bytes on the mbarrier at bar.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int col, int row,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

// TMA: the box at (column col, row row) of the tensor map into L2 only (no shared memory, no
// barrier): a later TmaLoad2d of it then hits L2.
__device__ __forceinline__ void TmaPrefetch2d(const CUtensorMap* map, int col, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row)
               : "memory");
}

// Every 64-column chunk of the box at tensor-map row `row` into L2.
__device__ __forceinline__ void PrefetchBox(const CUtensorMap* map, int row) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) TmaPrefetch2d(map, c * 64, row);
}

// The tensor-map row of box `box` of the tile starting at latent key0 (lane-parallel: one box per
// lane); a box past ke repeats the last valid box (its rows are zeroed before P V).
template <typename T>
__device__ __forceinline__ int BoxRow(const LatentParams<T>& p, const TmaGeometry& g,
                                      const int32_t* table, int key0, int box, int ke) {
  int key = key0 + box * g.box_rows;
  if (key >= ke) key = (ke - 1) / g.box_rows * g.box_rows;
  return table[key / p.block_size] * g.rows_per_block + g.layer_row + key % p.block_size;
}

// One warp: issues chunks [c0, c1) of one tile into the stage at smem address dst (barriers at
// bars) from the rows lane l < boxes holds in `rows`: lane 0 arms the barriers, then each box's
// lane issues its own copies (lane 0 issuing every box made a 16-latent page's tile 36 copies in a
// row: kernels/mla/BENCHMARKS.md, twenty-second session).
__device__ __forceinline__ void IssueChunks(const CUtensorMap* map, const TmaGeometry& g, int rows,
                                            int boxes, uint32_t dst, uint32_t bars, int lane,
                                            int c0, int c1) {
  if (lane == 0) {
    for (int c = c0; c < c1; ++c) MbarExpectTx(bars + 8 * c, kBlockBytes);
  }
  __syncwarp();
  if (lane < boxes) {
    for (int c = c0; c < c1; ++c) {
      TmaLoad2d(dst + c * kBlockBytes + lane * g.box_rows * 128, map, c * 64, rows, bars + 8 * c);
    }
  }
}

// A warpgroup's scores of one tile, chunk by chunk as the chunks land.
template <typename T>
__device__ __forceinline__ void ScoresByChunk(float (&sc)[32], uint32_t q_addr, uint32_t k_addr,
                                              uint64_t* bars, uint32_t parity) {
  using internal::prefill::SmemDesc;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    internal::prefill::MbarWait(bars + c, parity);
    internal::prefill::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = c * kBlockBytes + kk * 32;
      wgmma_common::WgmmaSS64<T>(sc, SmemDesc(q_addr + off, 16, 1024),
                                 SmemDesc(k_addr + off, 16, 1024), (c | kk) != 0 ? 1u : 0u);
    }
    internal::prefill::WgmmaCommit();
  }
  internal::prefill::WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) internal::prefill::FenceOperand(sc[i]);
}

// Zeroes rows [valid, 64) of the stage's V chunks [c0, c1) by `threads` threads (t the thread's
// index among them; generic writes, made visible to the async proxy the P V wgmma reads through).
__device__ __forceinline__ void ZeroTailChunks(uint8_t* stage, int valid, int t, int threads,
                                               int c0, int c1) {
  const int units = (c1 - c0) * 8;
  for (int i = t; i < (kKeys - valid) * units; i += threads) {
    const int r = valid + i / units, u = i % units;
    *reinterpret_cast<uint4*>(stage + (c0 + u / 8) * kBlockBytes + r * 128 + (u % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  internal::prefill::FenceProxyAsync();
}

// Phase stamps (mla_phase_stamps.h; measurement only, p.phase_stamps non-null): this CTA's word w.
__device__ __forceinline__ unsigned long long* StampWord(unsigned long long* stamps, int w) {
  const int64_t cta =
      blockIdx.x + gridDim.x * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  return stamps + cta * kMlaStampWords + w;
}
// One thread: %globaltimer and clock64 of `phase` (and, at entry, the SM id).
inline __device__ __noinline__ void WritePhaseStamp(unsigned long long* stamps, int phase) {
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  const long long ck = clock64();
  *StampWord(stamps, phase) = gt;
  *StampWord(stamps, kMlaPhases + phase) = static_cast<unsigned long long>(ck);
  if (phase == kMlaPhaseEntry) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    *StampWord(stamps, kMlaStampSm) = sm;
  }
}

// A tiled tensor map over `data` of `rank` dims (dims[0] innermost, strides in bytes of dims 1..,
// elements strides 1), boxes `box`, the given element type and swizzle; `what` names it in errors.
inline absl::StatusOr<CUtensorMap> EncodeLatentMap(void* data, CUtensorMapDataType type, int rank,
                                                   const cuuint64_t* dims,
                                                   const cuuint64_t* strides, const cuuint32_t* box,
                                                   CUtensorMapSwizzle swizzle, const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = internal::TensorMapEncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is not available");
  CUtensorMap map{};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(&map, type, rank, data, dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cuTensorMapEncodeTiled (", what, ") failed: ", static_cast<int>(r)));
  }
  return map;
}

// The tensor map of the pool ([total rows][576] of T, 128-byte swizzle, boxes of 64 columns x
// box_rows rows).
inline absl::StatusOr<CUtensorMap> EncodePoolMap(const DeviceKvCache& cache, int box_rows,
                                                 bool bf16) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kD),
                              static_cast<cuuint64_t>(cache.layout.TotalElems() / kD)};
  const cuuint64_t strides[1] = {kD * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return EncodeLatentMap(cache.data,
                         bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                         2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, "latent pool");
}

// Launches `kernel` (one of the TMA kernels: (params, tensor map, geometry), kMlaWgmmaThreads
// threads, kSmemBytes of dynamic shared memory) over `cache`'s layer `layer`.
template <typename T, typename Kernel>
absl::Status LaunchTmaKernel(Kernel kernel, const LatentParams<T>& p, const DeviceKvCache& cache,
                             int64_t layer, dim3 grid, cudaStream_t stream) {
  const int64_t bs = cache.layout.block_size;
  const TmaGeometry g{static_cast<int>(cache.layout.num_layers * bs), static_cast<int>(layer * bs),
                      static_cast<int>(bs < 64 ? bs : 64)};
  ASSIGN_OR_RETURN(const CUtensorMap map,
                   EncodePoolMap(cache, g.box_rows, std::is_same_v<T, __nv_bfloat16>));
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<grid, kMlaWgmmaThreads, kSmemBytes, stream>>>(p, map, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The in-kernel merge after a CTA's partial stores (every thread): the last of the group's
// `filled` split CTAs merges their rows (row tiles of kTileRows) into o_lat / lse, with
// paged_decode_merge.cuh's TakeMergeTicket / MergeGroupSplits. scratch: idle shared memory for the
// merge's weights (the kernels' latent stages once every issued tile has been read). Shared by
// the TMA kernel (64-row tiles) and kRows16 (16).
template <int kTileRows, typename T>
__device__ __forceinline__ void MergeInKernel(const LatentParams<T>& p, const LatentCta& c,
                                              int filled, uint8_t* scratch,
                                              unsigned long long* stamps) {
  unsigned int* counter = p.merge_counters + blockIdx.z * gridDim.y + blockIdx.y;
  const bool won = internal::TakeMergeTicket(counter, filled, reinterpret_cast<int*>(scratch));
  if (stamps != nullptr && threadIdx.x == 0) {
    WritePhaseStamp(stamps, kMlaPhaseTicket);
    *StampWord(stamps, kMlaStampTicket) = won ? 2 : 1;
  }
  if (!won) return;
  const int64_t first = static_cast<int64_t>(c.q0) * p.heads + c.r0;
  const int n_rows = min(kTileRows, c.rows_seq - c.r0);
  const auto row_of = [first](int rr) { return first + rr; };
  if (stamps == nullptr) {
    internal::MergeGroupSplits<T, 512>(p.part_o, p.part_lse, filled,
                                       static_cast<int64_t>(p.num_tokens) * p.heads, n_rows, row_of,
                                       p.o_lat, p.lse, reinterpret_cast<float*>(scratch) + 4);
  } else {  // the merge's own phases: clock64 after the LSEs, after the weights
    const auto probe = [stamps](int i) {
      if (threadIdx.x == 0) *StampWord(stamps, kMlaStampMergeLse + i) = clock64();
    };
    internal::MergeGroupSplits<T, 512>(
        p.part_o, p.part_lse, filled, static_cast<int64_t>(p.num_tokens) * p.heads, n_rows, row_of,
        p.o_lat, p.lse, reinterpret_cast<float*>(scratch) + 4, probe);
  }
  if (stamps != nullptr) {  // CTA-uniform
    __syncthreads();
    if (threadIdx.x == 0) WritePhaseStamp(stamps, kMlaPhaseMergeDone);
  }
}

}  // namespace tandem::kernels::cuda::mla_internal::tma_kernel

#endif  // TANDEM_KERNELS_MLA_MLA_TMA_CUH_
