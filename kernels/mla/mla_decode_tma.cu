// The Hopper (sm_90a) latent attention kernel with TMA loads behind MlaLatentAttention (mla_cuda.h)
// for latent 512 + 64, bf16 / fp16, pages of 8, 16, 32 or a multiple of 64 latents: the default
// where it applies (MlaPlanInput::allow_tma); mla_decode_wgmma.cu's cp.async kernel is the A/B
// baseline and serves the other page sizes. FlashMLA's loading scheme, our code.
//
// Same CTA as the cp.async kernel: 64 (query token x head) rows of one request x one split of its
// context, two warpgroups, Q (72 KiB) and a 2-stage ring of 64-latent x 576-dim tiles in wgmma's
// 128-byte-swizzled layout (225 KiB, one CTA per SM). What changes is the loading:
//   * a tile arrives by TMA (cp.async.bulk.tensor.2d over the pool viewed as [rows][576]: nine
//     64-column chunks per page box, the swizzle done by the copy engine), issued by one warp of
//     warpgroup 1 as soon as both warpgroups are done with the stage; no thread copies latents;
//   * each 64-column chunk of a stage has its own "full" mbarrier (expect-tx 8 KiB), so the
//     score wgmma of chunk c starts as soon as chunk c has landed (FlashMLA's per-chunk waits);
//   * the block-table entries of the next tile are loaded by the issuing warp one tile ahead, so
//     no thread waits on a table read, and there is no CTA-wide barrier at the top of a tile.
// Per tile t (stage t % 2): warpgroup 0 scores (36 wgmma, chunk by chunk), runs the online
// softmax, hands P and the rescale factors over in shared memory (named barrier 1, both
// warpgroups), then each warpgroup adds P V for its 256 output columns; named barrier 2 (both)
// retires the stage, and warp 4 issues tile t + 2 into it. Warpgroup 0 writes P for tile t + 1
// only after barrier 2 of tile t, which warpgroup 1 reaches after reading P of tile t: one P
// buffer, every hand-over a bar.sync of all 256 threads (no bar.arrive).
// The last tile of a split can hold rows past its end (a page box is loaded whole, boxes past the
// end repeat the last valid box): warpgroup 0 zeroes those rows' V columns after the scores
// (masked to -inf by select, so stale values never reach them) and before P V.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace: the compute_90 pass compiles the kernel body away, and nvcc would
// then flag every helper of internal linkage as unused.
namespace tma_kernel {

using internal::prefill::FenceOperand;
using internal::prefill::FenceProxyAsync;
using internal::prefill::MbarInit;
using internal::prefill::MbarWait;
using internal::prefill::SmemDesc;
using internal::prefill::WgmmaCommit;
using internal::prefill::WgmmaFence;
using internal::prefill::WgmmaRS;
using internal::prefill::WgmmaWait;
using wgmma_common::BarSync;
using wgmma_common::CopyTileRow;
using wgmma_common::LoadP;
using wgmma_common::RescaleAndAddPv;
using wgmma_common::ShareWg0RowSums;
using wgmma_common::Softmax;
using wgmma_common::StoreP;
using wgmma_common::StoreWgRows;
using wgmma_common::WgmmaSS64;

inline constexpr int kD = 576, kRows = 64, kKeys = 64, kChunks = kD / 64;
constexpr int kBlockBytes = 64 * 128;              // one 64-column chunk of 64 rows (8 KiB)
constexpr int kTileBytes = kChunks * kBlockBytes;  // Q, or one latent stage: 72 KiB
constexpr int kPOff = 3 * kTileBytes;              // P: [4 k16 steps][128 threads] uint4
constexpr int kFOff = kPOff + 4 * 128 * 16;        // rescale factors: [128 threads] float2
constexpr int kBarOff = kFOff + 128 * 8;           // full barriers: [2 stages][9 chunks]
constexpr int kSmemBytes = kBarOff + 2 * kChunks * 8 + 1024;  // + slack for 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
inline constexpr int kIssueWarp = 4;  // warp 0 of warpgroup 1 loads the tiles

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

// The tensor-map row of box `box` of the tile starting at latent key0 (lane-parallel: one box per
// lane); a box past ke repeats the last valid box (its rows are zeroed before P V).
template <typename T>
__device__ __forceinline__ int BoxRow(const LatentParams<T>& p, const TmaGeometry& g,
                                      const int32_t* table, int key0, int box, int ke) {
  int key = key0 + box * g.box_rows;
  if (key >= ke) key = (ke - 1) / g.box_rows * g.box_rows;
  return table[key / p.block_size] * g.rows_per_block + g.layer_row + key % p.block_size;
}

// Warp kIssueWarp: issues one tile into the stage at smem address dst (barriers at bars) from the
// rows lane l < boxes holds in `rows`.
__device__ __forceinline__ void IssueTile(const CUtensorMap* map, const TmaGeometry& g, int rows,
                                          int boxes, uint32_t dst, uint32_t bars, int lane) {
  if (lane == 0) {
    for (int c = 0; c < kChunks; ++c) MbarExpectTx(bars + 8 * c, kBlockBytes);
  }
  for (int b = 0; b < boxes; ++b) {
    const int row = __shfl_sync(0xffffffffu, rows, b);
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        TmaLoad2d(dst + c * kBlockBytes + b * g.box_rows * 128, map, c * 64, row, bars + 8 * c);
      }
    }
  }
}

// Warpgroup 0's scores of one tile, chunk by chunk as the chunks land.
template <typename T>
__device__ __forceinline__ void ScoresByChunk(float (&sc)[32], uint32_t q_addr, uint32_t k_addr,
                                              uint64_t* bars, uint32_t parity) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    MbarWait(bars + c, parity);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = c * kBlockBytes + kk * 32;
      WgmmaSS64<T>(sc, SmemDesc(q_addr + off, 16, 1024), SmemDesc(k_addr + off, 16, 1024),
                   (c | kk) != 0 ? 1u : 0u);
    }
    WgmmaCommit();
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) FenceOperand(sc[i]);
}

// Zeroes rows [valid, 64) of the V chunks (0-7) of the stage at `stage` (generic writes, made
// visible to the async proxy the P V wgmma reads through).
__device__ __forceinline__ void ZeroTail(uint8_t* stage, int valid, int wt) {
  for (int i = wt; i < (kKeys - valid) * 64; i += 128) {
    const int r = valid + i / 64, u = i % 64;
    *reinterpret_cast<uint4*>(stage + (u / 8) * kBlockBytes + r * 128 + (u % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsync();
}

template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaThreads, 1)
    MlaTmaKernel(const __grid_constant__ LatentParams<T> p, const __grid_constant__ CUtensorMap map,
                 const TmaGeometry g) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint4* sp = reinterpret_cast<uint4*>(smem + kPOff);
  float2* sf = reinterpret_cast<float2*>(smem + kFOff);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);

  const LatentCta c = LatentCtaOf(p, kRows);
  if (c.r0 >= c.rows_seq) return;
  const int split = blockIdx.x, q0 = c.q0, rows_seq = c.rows_seq, r0 = c.r0, kb = c.kb, ke = c.ke;
  const int32_t* table = c.table;
  const int num_tiles = c.Tiles(kKeys);
  const int tid = threadIdx.x, wg = tid / 128, wt = tid % 128;
  const int lane = tid % 32, t4 = lane % 4, warp = tid / 32;
  const int row_lo = (wt / 32) * 16 + lane / 4, row_hi = row_lo + 8;
  const uint32_t q_addr = SmemAddr(smem), bar_addr = SmemAddr(full);
  const int boxes = kKeys / g.box_rows;

  if (tid == 0) {
    for (int i = 0; i < 2 * kChunks; ++i) MbarInit(full + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // The issuing warp: tiles 0 and 1 now, then lane l keeps box l's row of the next tile.
  int next_rows = 0;
  if (warp == kIssueWarp) {
    for (int t = 0; t < 2 && t < num_tiles; ++t) {
      const int rows = lane < boxes ? BoxRow(p, g, table, kb + t * kKeys, lane, ke) : 0;
      IssueTile(&map, g, rows, boxes, q_addr + (1 + t) * kTileBytes, bar_addr + t * kChunks * 8,
                lane);
    }
    if (2 < num_tiles && lane < boxes) next_rows = BoxRow(p, g, table, kb + 2 * kKeys, lane, ke);
  }
  // Q (zero rows beyond the request's), by cp.async: four threads per row.
  {
    const int crow = tid / 4, cpart = tid % 4;
    const bool ok = r0 + crow < rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(q0) * p.heads + r0 + crow) * kD : p.q;
    CopyTileRow(smem, crow, cpart, src, ok);
    CpAsyncCommit();
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();
  }

  const int vis[2] = {c.KeyEnd(p, row_lo), c.KeyEnd(p, row_hi)};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t & 1;
    const uint32_t k_addr = q_addr + (1 + st) * kTileBytes;
    uint32_t pa[4][4];
    float alpha[2];
    if (wg == 0) {
      float sc[32];
      ScoresByChunk<T>(sc, q_addr, k_addr, full + st * kChunks, (t >> 1) & 1);
      const int key0 = kb + t * kKeys;
      Softmax<T>(sc, key0, t4, vis, p.scale_log2, m_run, l_run, alpha, pa);
      if (ke - key0 < kKeys) ZeroTail(smem + (1 + st) * kTileBytes, ke - key0, wt);
      StoreP(sp, wt, pa);
      sf[wt] = make_float2(alpha[0], alpha[1]);
      BarSync(1, kMlaWgmmaThreads);
    } else {
      BarSync(1, kMlaWgmmaThreads);
      const float2 f = sf[wt];
      alpha[0] = f.x;
      alpha[1] = f.y;
      LoadP(sp, wt, pa);
    }
    RescaleAndAddPv<T>(o, pa, alpha, k_addr, wg);  // O[:, 256 wg .. + 256) = alpha O + P V
    BarSync(2, kMlaWgmmaThreads);                  // stage st is free; warpgroup 1 has read P
    if (warp == kIssueWarp && t + 2 < num_tiles) {
      IssueTile(&map, g, next_rows, boxes, k_addr, bar_addr + st * kChunks * 8, lane);
      if (t + 3 < num_tiles && lane < boxes) {
        next_rows = BoxRow(p, g, table, kb + (t + 3) * kKeys, lane, ke);
      }
    }
  }

  // Row sums: warpgroup 0's, through the (now idle) P buffer.
  float l[2];
  ShareWg0RowSums(reinterpret_cast<float*>(smem + kPOff), wg, t4, row_lo, l_run, l);
  StoreWgRows(p, split, q0, r0, rows_seq, row_lo, wg, t4, o, l, m_run);
#endif
}

// The tensor map of the pool ([total rows][576] of T, 128-byte swizzle, boxes of 64 columns x
// box_rows rows).
absl::StatusOr<CUtensorMap> EncodePoolMap(const DeviceKvCache& cache, int box_rows, bool bf16) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = internal::TensorMapEncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is not available");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kD),
                              static_cast<cuuint64_t>(cache.layout.TotalElems() / kD)};
  const cuuint64_t strides[1] = {kD * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
             cache.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cuTensorMapEncodeTiled failed: ", static_cast<int>(r)));
  }
  return map;
}

}  // namespace tma_kernel

bool MlaTmaFits(const DeviceKvCache& cache) {
  const int64_t bs = cache.layout.block_size;
  const int64_t box_rows = bs < 64 ? bs : 64;
  return (bs % 64 == 0 || 64 % bs == 0) && box_rows % 8 == 0 &&
         cache.layout.TotalElems() / tma_kernel::kD < (int64_t{1} << 31) &&
         reinterpret_cast<uintptr_t>(cache.data) % 16 == 0;
}

template <typename T>
absl::Status LaunchMlaTma(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                          dim3 grid, cudaStream_t stream) {
  using tma_kernel::kSmemBytes;
  using tma_kernel::MlaTmaKernel;
  const int64_t bs = cache.layout.block_size;
  const tma_kernel::TmaGeometry g{static_cast<int>(cache.layout.num_layers * bs),
                                  static_cast<int>(layer * bs),
                                  static_cast<int>(bs < 64 ? bs : 64)};
  ASSIGN_OR_RETURN(const CUtensorMap map,
                   tma_kernel::EncodePoolMap(cache, g.box_rows, std::is_same_v<T, __nv_bfloat16>));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaTmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  MlaTmaKernel<T><<<grid, kMlaWgmmaThreads, kSmemBytes, stream>>>(p, map, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchMlaTma<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                                  const DeviceKvCache&, int64_t, dim3,
                                                  cudaStream_t);
template absl::Status LaunchMlaTma<__half>(const LatentParams<__half>&, const DeviceKvCache&,
                                           int64_t, dim3, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
