// MlaTmaSchedule::kRows16 (issue 33): the Hopper latent kernel for row tiles of <= 16 query rows
// (heads x q_len <= 16: DeepSeek-V2-Lite's 16 heads, DeepSeek-V3 at TP = 8), FlashAttention-2
// style on mma.sync m16n8k16 with no padding (the wgmma kernels pad 16 rows to M = 64: at 16 heads
// they are compute-bound by 4x wasted tensor work, BENCHMARKS.md). Same grid, plan, workspace,
// partial layout and in-kernel merge as mla_decode_tma.cu (LatentCtaOf over tiles of 16 rows; the
// plan's row tiles of 64 are one tile here since the plan picks kRows16 only for <= 16 rows).
//
// Loading: TMA tiles (the pool as a [rows][9 chunks][64] tensor map, 128-byte swizzle over the
// 128-byte lines of a stage's [64 rows][9 chunks][64] layout, LatentOffset; one copy a box, i.e. a
// page run of up to 64 rows, and one full mbarrier a stage), issued by warp kIssueWarp, one lane a
// box, whose lanes keep the block-table rows of the next tile. (mla_tma.cuh's chunk-major tiles,
// one copy a chunk and box, made a 16-latent page's tile 36 copies from one lane: 35% slower than
// pages of 64, BENCHMARKS.md.) Three stages of 64 latents x 576 (Q lives in registers,
// so its 72 KiB of shared memory hold a third stage): tiles 0-1 are issued at entry; Q is staged
// once a CTA in stage 2's buffer (16-byte cp.async), read into registers by ldmatrix, and tile 2
// is issued after the CTA barrier that follows (StageQ / LoadQFrags); tile t + 2 (t >= 1) at
// barrier A of tile t (every warp has then finished P V of tile t - 1, whose stage it reuses).
// Every mbarrier wait traps after ~1 s of polls (MbarWaitOrTrap) instead of hanging.
// Per tile t (stage t % 3), 8 warps, 256 threads:
//   * QK: warp w scores S[16 rows][tokens 8 w .. 8 w + 8) over the 576 dims once the tile lands:
//     Q as A fragments in registers (loaded once, LoadQFrags), K by ldmatrix from the swizzled
//     stage (LatentOffset), two accumulator chains;
//   * online softmax: masked scores (each row's own key end, KeyEnd) -> the warp's row maxima in
//     shared memory, barrier A (named barrier 1), every warp takes the same tile maxima, so the
//     running max and the rescale factor alpha are the same in all warps; each warp keeps the
//     partial row sums of its own tokens (summed over warps in the epilogue);
//   * P (16 x 64 of T, 128-byte rows, swizzled) to shared memory; the last tile's V rows past the
//     split's end zeroed by the warp that reads them (its 64 columns); barrier B (named barrier 2);
//   * PV: warp w owns output columns [64 w, 64 w + 64) = chunk w of each row: O = alpha O + P V,
//     P by ldmatrix, V by ldmatrix.trans (8 n8 tiles, 32 fp32 registers).
// Buffers: one P and one max array suffice (a warp writes them for tile t + 1 only after barrier A
// of tile t + 1, which every warp reaches after reading them for tile t).
// Epilogue: the row sums over the quads and warps, then o_lat / lse or the fp32 partial (as
// StoreWgRows), and the in-kernel merge (mla_tma.cuh's MergeInKernel). The L2 prefetch
// variant (MlaPlanInput::tma_l2_prefetch_tiles) is a kSerial / kHandOff A/B only: a plan that asks
// for it runs kSerial (PlanMla), never this kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_rows16.cuh"
#include "kernels/mla/mla_tma.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace (see mla_decode_tma.cu: the compute_90 pass empties the kernel).
namespace rows16_kernel {

using tma_kernel::BoxRow;
using tma_kernel::kChunks;
using tma_kernel::kD;
using tma_kernel::kTileBytes;
using tma_kernel::TmaGeometry;
using wgmma_common::BarSync;

using rows16_common::ClusterMergeRows;
using rows16_common::kClusterBytes;
using rows16_common::kKeys;
using rows16_common::kQPitch;
using rows16_common::kRows;
using rows16_common::kThreads;
using rows16_common::kWarps;
using rows16_common::MaskAndShareMax;
using rows16_common::SoftmaxToP;
using rows16_common::StageQ;
using rows16_common::StoreRows;

inline constexpr int kStages = 3;
inline constexpr int kKSteps = kD / 16;              // 36 k16 steps of the scores
inline constexpr int kPOff = kStages * kTileBytes;   // P: [16 rows][128 bytes], swizzled
inline constexpr int kRedOff = kPOff + kRows * 128;  // [8 warps][16 rows] float: maxima, sums
inline constexpr int kBarOff = kRedOff + kWarps * kRows * 4;  // full barriers: [3 stages]
inline constexpr int kSmemBytes = kBarOff + 256 + 1024;       // + slack for 1024-byte alignment
static_assert(kStages * 8 <= 256);
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
static_assert(internal::MergeSmemFloats(kRows, 256) * 4 <= kTileBytes,
              "the merge's weights of 256 splits fit in a latent stage");
static_assert(kClusterBytes <= kStages * kTileBytes,
              "the cluster merge's partial and scratch fit in the latent stages");
static_assert(kRows * kQPitch <= kTileBytes, "Q fits in a latent stage");
inline constexpr int kIssueWarp = 0;

// The byte offset of 16-byte unit u of chunk ch of latent row tok in a stage ([64 rows][9 chunks]
// [64 values], the copy engine's 128-byte swizzle over the 128-byte lines).
__device__ __forceinline__ uint32_t LatentOffset(int tok, int ch, int u) {
  const int line = tok * kChunks + ch;
  return line * 128 + ((u ^ (line & 7)) * 16);
}

// One box of the 3-D pool map (64 values x 9 chunks x box rows) at pool row `row`.
__device__ __forceinline__ void TmaLoadBox(uint32_t dst, const CUtensorMap* map, int row,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(row), "r"(bar)
      : "memory");
}

// One warp: the tile whose box lane l < boxes holds (pool row `row`, BoxRow) into the stage at
// smem address dst on the stage's barrier bar: lane 0 arms it, each box's lane issues its box (one
// copy: every chunk of its rows; a copy a chunk and box cost 16-latent pages ~35%, BENCHMARKS.md).
__device__ __forceinline__ void IssueTile(const CUtensorMap* map, const TmaGeometry& g, int row,
                                          int boxes, uint32_t dst, uint32_t bar, int lane) {
  if (lane == 0) tma_kernel::MbarExpectTx(bar, kTileBytes);
  __syncwarp();
  if (lane < boxes) TmaLoadBox(dst + lane * g.box_rows * (kD * 2), map, row, bar);
}

// Zeroes rows [valid, 64) of chunk `chunk` of the stage (one warp; generic writes, fenced for the
// TMA that later refills the stage).
__device__ __forceinline__ void ZeroTailChunk(uint8_t* stage, int valid, int chunk, int lane) {
  for (int i = lane; i < (kKeys - valid) * 8; i += 32) {
    *reinterpret_cast<uint4*>(stage + LatentOffset(valid + i / 8, chunk, i % 8)) =
        make_uint4(0, 0, 0, 0);
  }
  internal::prefill::FenceProxyAsync();
  __syncwarp();
}

// The thread's A fragments of Q for all 36 k16 steps from the staged Q at shared address sq
// (rows lane / 4 and + 8 of the CTA's; rows past the request's are zero): qa[ks] = {row lo k,
// row hi k, row lo k + 8, row hi k + 8}, by ldmatrix.x4 (matrices: rows 0-7 / 8-15 x dims k /
// k + 8; lane l addresses row l % 16, dims + 8 (l / 16)): the bits the former 4-byte __ldg gave.
__device__ __forceinline__ void LoadQFrags(uint32_t sq, int lane, uint32_t (&qa)[kKSteps][4]) {
  const uint32_t src = sq + (lane % 16) * kQPitch + (lane / 16) * 16;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) LdMatrixX4(src + ks * 32, qa[ks]);
}

// Warp w's scores of the tile in the stage at shared address stage: s = {row lo, tokens 2 (lane %
// 4) + 0 / 1; row hi, same} of tokens [8 w, 8 w + 8), chunk by chunk as the chunks land.
template <typename T>
__device__ __forceinline__ void TileScores(float (&s)[4], const uint32_t (&qa)[kKSteps][4],
                                           uint32_t stage, uint64_t* bar, uint32_t parity, int warp,
                                           int lane) {
  float acc[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i / 4][i % 4] = 0.0f;
  const int tok = warp * 8 + lane % 8;
  internal::MbarWaitOrTrap(bar, parity);  // a protocol bug traps, never hangs
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t b[4];
      const int u = kk * 4 + lane / 8;  // matrices: k-step 2 kk (dims 0-7, 8-15), 2 kk + 1
      LdMatrixX4(stage + LatentOffset(tok, c, u), b);
      const int ks = c * 4 + kk * 2;
      Mma16816<T>(acc[0], qa[ks], b[0], b[1]);
      Mma16816<T>(acc[1], qa[ks + 1], b[2], b[3]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = acc[0][i] + acc[1][i];
}

// O[16][64 w ..) = alpha O + P V: P from shared memory (p_addr), V = chunk w of the stage.
template <typename T>
__device__ __forceinline__ void AddPv(float (&o)[32], const float (&alpha)[2], uint32_t p_addr,
                                      uint32_t stage, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] *= alpha[(i % 4) / 2];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    const int pr = lane % 16, pu = kk * 2 + lane / 16;
    LdMatrixX4(p_addr + pr * 128 + ((pu ^ (pr % 8)) * 16), a);
    const int tok = kk * 16 + lane % 16;  // lanes 8-15 / 24-31: tokens + 8
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      uint32_t b[4];
      const int u = jj * 2 + lane / 16;
      LdMatrixX4Trans(stage + LatentOffset(tok, warp, u), b);
      Mma16816<T>(o + 8 * jj, a, b[0], b[1]);
      Mma16816<T>(o + 8 * jj + 4, a, b[2], b[3]);
    }
  }
}

// The issuing warp's prologue: the barriers, the table rows of tiles 0-3 into rows (lane l: box
// l), tiles 0 and 1 (stage 2 holds Q until every warp has its fragments: the kernel body issues
// tile 2). kPrewait: only those of tiles 0-1 wholly below pre_end (the latents the kernel before
// this one cannot be writing) before griddepcontrol.wait, the rest after it (tile 2 after Q, the
// preceding kernel's output); every other thread of the CTA waits in the kernel body.
template <typename T, bool kPrewait>
__device__ __forceinline__ void IssuePrologue(const LatentParams<T>& p, const LatentCta& c,
                                              const CUtensorMap* map, const TmaGeometry& g,
                                              uint64_t* full, uint32_t base, uint32_t bar_addr,
                                              int num_tiles, int boxes, int lane,
                                              int (&rows)[kStages + 1]) {
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) internal::prefill::MbarInit(full + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#pragma unroll
  for (int t = 0; t <= kStages; ++t) {
    rows[t] =
        t < num_tiles && lane < boxes ? BoxRow(p, g, c.table, c.kb + t * kKeys, lane, c.ke) : 0;
  }
  __syncwarp();
  int pre = 0;  // tiles issued before the wait
  if constexpr (kPrewait) {
    const int pre_end = LocalKeyEnd(p, c.ctx - c.q_len);  // older latents: already written
    while (pre < kStages - 1 && pre < num_tiles && c.kb + (pre + 1) * kKeys <= pre_end) ++pre;
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < pre) {
        IssueTile(map, g, rows[t], boxes, base + t * kTileBytes, bar_addr + t * 8, lane);
      }
    }
    internal::WaitForPrecedingGrid();
  }
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t >= pre && t < num_tiles) {
      IssueTile(map, g, rows[t], boxes, base + t * kTileBytes, bar_addr + t * 8, lane);
    }
  }
}

// kPrewait: MlaPlanInput::prewait (launched with PDL; IssuePrologue). kStamps: p.phase_stamps
// non-null (the measurement's own instantiation: the default one carries no stamp code).
// kCluster: MlaPlanInput::cluster_merge (launched in clusters of gridDim.x CTAs, the group's
// splits): a CTA past its request's filled splits runs no tile and holds an empty split (LSE
// -inf, o 0) for the merge; no tickets (p.merge_counters unused), no workspace partials.
template <typename T, bool kPrewait, bool kStamps, bool kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    MlaRows16Kernel(const __grid_constant__ LatentParams<T> p,
                    const __grid_constant__ CUtensorMap map, const TmaGeometry g) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  float* red = reinterpret_cast<float*>(smem + kRedOff);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  unsigned long long* const stamps = kStamps ? p.phase_stamps : nullptr;
  if (stamps != nullptr && tid == 0) tma_kernel::WritePhaseStamp(stamps, kMlaPhaseEntry);
  if constexpr (kPrewait) internal::AllowDependentLaunch();  // its wait covers this whole grid
  if (tid == kIssueWarp * 32) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
  }
  const LatentCta c = LatentCtaOf(p, kRows);
  const bool merge = !kCluster && p.merge_counters != nullptr;
  if (kPrewait && !kCluster && !merge) internal::WaitForPrecedingGrid();  // EmptySplitDone stores
  const int filled = merge ? c.Filled() : 0;
  // (kCluster: the whole cluster, one group, leaves here or none of it does.)
  if (c.r0 >= c.rows_seq ||
      (!kCluster && (merge ? blockIdx.x >= filled : EmptySplitDone(p, c, kRows)))) {
    return;
  }
  const int kb = c.kb, ke = c.ke, num_tiles = c.Tiles(kKeys), boxes = kKeys / g.box_rows;
  const uint32_t base = SmemAddr(smem), bar_addr = SmemAddr(full);

  int rows[kStages + 1] = {};
  if (warp == kIssueWarp) {
    IssuePrologue<T, kPrewait>(p, c, &map, g, full, base, bar_addr, num_tiles, boxes, lane, rows);
  } else if constexpr (kPrewait) {
    internal::WaitForPrecedingGrid();  // Q (q_cat) is the preceding kernel's output
  }
  if (stamps != nullptr && tid == 0) {
    tma_kernel::WritePhaseStamp(stamps, kMlaPhaseSetup);
    *tma_kernel::StampWord(stamps, kMlaStampTiles) = num_tiles;
  }
  constexpr int kQStage = kStages - 1;  // Q's buffer until tile 2 is issued
  StageQ(p, c, smem + kQStage * kTileBytes, tid);
  __syncthreads();  // Q staged; the barriers initialized
  uint32_t qa[kKSteps][4];
  LoadQFrags(base + kQStage * kTileBytes, lane, qa);
  internal::prefill::FenceProxyAsync();  // the stage's cp.async writes before the TMA's writes
  __syncthreads();  // every warp has read Q: its stage may be overwritten (generic reads, then TMA)
  if (warp == kIssueWarp && kQStage < num_tiles) {
    IssueTile(&map, g, rows[kQStage], boxes, base + kQStage * kTileBytes, bar_addr + kQStage * 8,
              lane);
  }
  int next_rows = rows[kStages];
  if (stamps != nullptr && tid == 0) {
    tma_kernel::WritePhaseStamp(stamps, kMlaPhaseQ);
    if (num_tiles > 0) {  // tile 0's every chunk landed (a wait the loop's then passes at once)
      internal::MbarWaitOrTrap(full, 0);
      tma_kernel::WritePhaseStamp(stamps, kMlaPhaseFirstTile);
    }
  }

  const int vis[2] = {c.KeyEnd(p, lane / 4), c.KeyEnd(p, lane / 4 + 8)};
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t % kStages;
    const uint32_t stage = base + st * kTileBytes;
    const int key0 = kb + t * kKeys;
    float s[4];
    TileScores<T>(s, qa, stage, full + st, (t / kStages) & 1, warp, lane);
    MaskAndShareMax(s, key0, warp, lane, vis, p.scale_log2, red);
    BarSync(1, kThreads);  // A: every warp's maxima; P V of tile t - 1 done everywhere
    if (warp == kIssueWarp && t >= 1 && t + 2 < num_tiles) {  // tile t + 2 into t - 1's stage
      const int s2 = (t + 2) % kStages;
      IssueTile(&map, g, next_rows, boxes, base + s2 * kTileBytes, bar_addr + s2 * 8, lane);
      if (t + 3 < num_tiles && lane < boxes) {
        next_rows = BoxRow(p, g, c.table, kb + (t + 3) * kKeys, lane, ke);
      }
    }
    float alpha[2];
    SoftmaxToP<T>(s, red, warp, lane, m_run, l_run, alpha, smem + kPOff);
    if (ke - key0 < kKeys) {  // V rows past the split's end: zero (NaN-safe P V), own chunk only
      ZeroTailChunk(smem + st * kTileBytes, ke - key0, warp, lane);
    }
    BarSync(2, kThreads);  // B: P complete
    AddPv<T>(o, alpha, base + kPOff, stage, warp, lane);
  }
  if (stamps != nullptr && tid == 0) tma_kernel::WritePhaseStamp(stamps, kMlaPhaseLastMath);

  if constexpr (kCluster) {
    StoreRows<T, true>(p, c, red, warp, lane, o, l_run, m_run, false,
                       reinterpret_cast<float*>(smem));
    if (stamps != nullptr && tid == 0) tma_kernel::WritePhaseStamp(stamps, kMlaPhaseStored);
    ClusterMergeRows(p, c, smem, stamps);
    return;
  }
  const bool direct = merge ? filled == 1 : p.num_splits == 1;
  StoreRows(p, c, red, warp, lane, o, l_run, m_run, direct);
  if (stamps != nullptr && tid == 0) tma_kernel::WritePhaseStamp(stamps, kMlaPhaseStored);
  if (merge && filled > 1) tma_kernel::MergeInKernel<kRows>(p, c, filled, smem, stamps);
#endif
}

}  // namespace rows16_kernel

namespace {
template <typename T, bool kCluster>
auto Rows16Kernel(bool prewait, bool stamps) {
  using rows16_kernel::MlaRows16Kernel;
  return prewait ? (stamps ? MlaRows16Kernel<T, true, true, kCluster>
                           : MlaRows16Kernel<T, true, false, kCluster>)
                 : (stamps ? MlaRows16Kernel<T, false, true, kCluster>
                           : MlaRows16Kernel<T, false, false, kCluster>);
}

// The pool as [rows][9 chunks][64 values] of T (a row: one latent of one page slot of one layer,
// as tma_kernel::EncodePoolMap's rows), a box = 64 values x 9 chunks x box_rows rows (one copy a
// page run of a tile), 128-byte swizzle (LatentOffset).
absl::StatusOr<CUtensorMap> EncodeRowsMap(const DeviceKvCache& cache, int box_rows, bool bf16) {
  using rows16_kernel::kChunks;
  using rows16_kernel::kD;
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(kChunks),
                              static_cast<cuuint64_t>(cache.layout.TotalElems() / kD)};
  const cuuint64_t strides[2] = {128, kD * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kChunks),
                             static_cast<cuuint32_t>(box_rows)};
  return tma_kernel::EncodeLatentMap(
      cache.data, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, "kRows16 latent rows");
}
}  // namespace

int MlaRows16MaxActiveClusters(int cluster_size) {
  const auto kernel = rows16_kernel::MlaRows16Kernel<__nv_bfloat16, false, false, true>;
  int n = 0;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster_size, 1, 1);
  config.blockDim = dim3(rows16_kernel::kThreads);
  config.dynamicSmemBytes = rows16_kernel::kSmemBytes;
  config.attrs = &attr;
  config.numAttrs = 1;
  if (rows16_common::SetRows16Attributes(kernel, rows16_kernel::kSmemBytes, true) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    return 0;
  }
  return n;
}

template <typename T>
absl::Status LaunchMlaRows16(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                             dim3 grid, bool prewait, bool cluster, cudaStream_t stream) {
  using rows16_kernel::kSmemBytes;
  const int64_t bs = cache.layout.block_size;
  const tma_kernel::TmaGeometry g{static_cast<int>(cache.layout.num_layers * bs),
                                  static_cast<int>(layer * bs),
                                  static_cast<int>(bs < 64 ? bs : 64)};
  ASSIGN_OR_RETURN(const CUtensorMap map,
                   EncodeRowsMap(cache, g.box_rows, std::is_same_v<T, __nv_bfloat16>));
  const bool st = p.phase_stamps != nullptr;
  return cluster ? rows16_common::LaunchRows16(Rows16Kernel<T, true>(prewait, st), grid, kSmemBytes,
                                               true, prewait, stream, p, map, g)
                 : rows16_common::LaunchRows16(Rows16Kernel<T, false>(prewait, st), grid,
                                               kSmemBytes, false, prewait, stream, p, map, g);
}

template absl::Status LaunchMlaRows16<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                                     const DeviceKvCache&, int64_t, dim3, bool,
                                                     bool, cudaStream_t);
template absl::Status LaunchMlaRows16<__half>(const LatentParams<__half>&, const DeviceKvCache&,
                                              int64_t, dim3, bool, bool, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
