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
//
// Prologue (issue 33: a batch-1 CTA is latency-bound, BENCHMARKS.md): the issuing thread
// prefetches the tensor map at entry (its fetch under the request's qsl / seq_lens loads),
// initializes the stage barriers itself (no CTA-wide barrier before the first TMA: the other
// warps touch the barriers only after the Q load's __syncthreads), and the issuing warp loads the
// block-table rows of tiles 0-2 together before issuing tiles 0 and 1 (each TMA issue is an asm
// with a memory clobber: a table load after it could not be hoisted above it, so tile 1's issue
// waited for a second load round trip). Variant (MlaPlanInput::tma_l2_prefetch_tiles, default
// off): the issuing warp also prefetches the latents of the next tiles into L2 (TMA prefetch).
//
// In-kernel merge (p.merge_counters, MlaPlan::merge_in_kernel): a group (request, row tile) whose
// context fills one split writes o_lat / lse directly; otherwise each filled split stores its fp32
// partial and takes a ticket (kernels/attention/cuda/paged_decode_merge.cuh's TakeMergeTicket),
// and the last one merges the group's rows (MergeGroupSplits, the GQA decode's in-kernel merge)
// in the idle latent stages; empty splits (past the request's context) return at once and take
// no ticket (the ticket count is the group's filled splits).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_tma.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace: the compute_90 pass compiles the kernel body away, and nvcc would
// then flag every helper of internal linkage as unused.
namespace tma_kernel {

using internal::prefill::FenceProxyAsync;
using internal::prefill::MbarInit;
using wgmma_common::BarArrive;
using wgmma_common::BarSync;
using wgmma_common::CopyTileRow;
using wgmma_common::LoadP;
using wgmma_common::RescaleAndAddPv;
using wgmma_common::ShareWg0RowSums;
using wgmma_common::Softmax;
using wgmma_common::StoreP;
using wgmma_common::StoreWgRows;

// Warp kIssueWarp: issues one whole tile (every chunk).
__device__ __forceinline__ void IssueTile(const CUtensorMap* map, const TmaGeometry& g, int rows,
                                          int boxes, uint32_t dst, uint32_t bars, int lane) {
  IssueChunks(map, g, rows, boxes, dst, bars, lane, 0, kChunks);
}

// Zeroes rows [valid, 64) of the V chunks (0-7) of the stage by warpgroup 0.
__device__ __forceinline__ void ZeroTail(uint8_t* stage, int valid, int wt) {
  ZeroTailChunks(stage, valid, wt, 128, 0, 8);
}

static_assert(internal::MergeSmemFloats(kRows, 256) * 4 <= 2 * kTileBytes,
              "the merge's weights of 256 splits fit in the two latent stages");
static_assert(internal::kMergeCounterBytes == kMlaMergeCounterBytes);

// kHandOff (MlaTmaSchedule::kHandOff): warpgroup 0 does not wait for warpgroup 1's P V. It only
// arrives at the P hand-over (barrier 1) and at the stage's release (barriers 2 / 4 by tile
// parity: it can run a tile ahead, so one id could otherwise see two of its arrivals before
// warpgroup 1's wait), and before storing the next P waits until warpgroup 1 has read the last
// one (barrier 3); so warpgroup 1's P V overlaps warpgroup 0's next scores.
// kPrefetch: the L2-prefetch variant (p.l2_prefetch_tiles > 0) compiled in; without it the tile
// loop carries none of its checks. kStamps: p.phase_stamps written (mla_phase_stamps.h; the
// measurement's own instantiation, with kPrefetch: the default ones carry no stamp code).
template <typename T, bool kHandOff, bool kPrefetch, bool kStamps = false>
__global__ void __launch_bounds__(kMlaWgmmaThreads, 1)
    MlaTmaKernel(const __grid_constant__ LatentParams<T> p, const __grid_constant__ CUtensorMap map,
                 const TmaGeometry g) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint4* sp = reinterpret_cast<uint4*>(smem + kPOff);
  float2* sf = reinterpret_cast<float2*>(smem + kFOff);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);

  const int tid = threadIdx.x;
  unsigned long long* const stamps = kStamps ? p.phase_stamps : nullptr;  // measurement only
  if (stamps != nullptr && tid == 0) WritePhaseStamp(stamps, kMlaPhaseEntry);
  if (tid == kIssueWarp * 32) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
  }
  const LatentCta c = LatentCtaOf(p, kRows);
  const bool merge = p.merge_counters != nullptr;
  const int filled = merge ? c.Filled() : 0;
  if (c.r0 >= c.rows_seq || (merge ? blockIdx.x >= filled : EmptySplitDone(p, c, kRows))) return;
  const int split = blockIdx.x, q0 = c.q0, rows_seq = c.rows_seq, r0 = c.r0, kb = c.kb, ke = c.ke;
  const int32_t* table = c.table;
  const int num_tiles = c.Tiles(kKeys);
  const int wg = tid / 128, wt = tid % 128;
  const int lane = tid % 32, t4 = lane % 4, warp = tid / 32;
  const int row_lo = (wt / 32) * 16 + lane / 4, row_hi = row_lo + 8;
  const uint32_t q_addr = SmemAddr(smem), bar_addr = SmemAddr(full);
  const int boxes = kKeys / g.box_rows;

  // The issuing warp: the barriers (its lane 0), the table rows of tiles 0-2, tiles 0 and 1 now;
  // then lane l keeps box l's row of the next tile.
  int next_rows = 0, pf_rows = 0;
  const int pf = kPrefetch ? p.l2_prefetch_tiles : 0;
  if (warp == kIssueWarp) {
    if (lane == 0) {
      for (int i = 0; i < 2 * kChunks; ++i) MbarInit(full + i, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    int rows[3];
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      rows[t] = t < num_tiles && lane < boxes ? BoxRow(p, g, table, kb + t * kKeys, lane, ke) : 0;
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      if (t < num_tiles) {
        IssueTile(&map, g, rows[t], boxes, q_addr + (1 + t) * kTileBytes,
                  bar_addr + t * kChunks * 8, lane);
      }
    }
    next_rows = rows[2];
    // L2 prefetch (p.l2_prefetch_tiles = pf): lane l takes box l % boxes of tile 2 + l / boxes,
    // tiles 2 .. 1 + pf (as many as 32 lanes cover); the loop then prefetches tile t + 2 + pf at
    // tile t, its rows loaded a tile ahead (pf_rows).
    if (pf > 0) {
      const int tp = 2 + lane / boxes;
      if (lane / boxes < pf && tp < num_tiles) {
        PrefetchBox(&map, BoxRow(p, g, table, kb + tp * kKeys, lane % boxes, ke));
      }
      if (2 + pf < num_tiles && lane < boxes) {
        pf_rows = BoxRow(p, g, table, kb + (2 + pf) * kKeys, lane, ke);
      }
    }
    if (stamps != nullptr && lane == 0) {
      WritePhaseStamp(stamps, kMlaPhaseSetup);
      *StampWord(stamps, kMlaStampTiles) = num_tiles;
    }
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
  if (stamps != nullptr && tid == 0) {
    WritePhaseStamp(stamps, kMlaPhaseQ);
    if (num_tiles > 0) {  // tile 0's every chunk landed (a wait the loop's then passes at once)
      for (int ch = 0; ch < kChunks; ++ch) internal::prefill::MbarWait(full + ch, 0);
      WritePhaseStamp(stamps, kMlaPhaseFirstTile);
    }
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
      if (kHandOff && t > 0) BarSync(3, kMlaWgmmaThreads);  // warpgroup 1 has read P(t - 1)
      StoreP(sp, wt, pa);
      sf[wt] = make_float2(alpha[0], alpha[1]);
      if constexpr (kHandOff) {
        BarArrive(1, kMlaWgmmaThreads);
      } else {
        BarSync(1, kMlaWgmmaThreads);
      }
    } else {
      BarSync(1, kMlaWgmmaThreads);
      const float2 f = sf[wt];
      alpha[0] = f.x;
      alpha[1] = f.y;
      LoadP(sp, wt, pa);
      if (kHandOff && t + 1 < num_tiles) BarArrive(3, kMlaWgmmaThreads);
    }
    RescaleAndAddPv<T>(o, pa, alpha, k_addr, wg);  // O[:, 256 wg .. + 256) = alpha O + P V
    if constexpr (kHandOff) {                      // stage st is free once both P V are done
      if (t + 2 < num_tiles) {
        if (wg == 0) {
          BarArrive(2 + 2 * st, kMlaWgmmaThreads);
        } else {
          BarSync(2 + 2 * st, kMlaWgmmaThreads);
        }
      }
    } else {
      BarSync(2, kMlaWgmmaThreads);  // stage st is free; warpgroup 1 has read P
    }
    if (warp == kIssueWarp && t + 2 < num_tiles) {
      IssueTile(&map, g, next_rows, boxes, k_addr, bar_addr + st * kChunks * 8, lane);
      if (t + 3 < num_tiles && lane < boxes) {
        next_rows = BoxRow(p, g, table, kb + (t + 3) * kKeys, lane, ke);
      }
    }
    if (warp == kIssueWarp && pf > 0 && t + 2 + pf < num_tiles && lane < boxes) {
      PrefetchBox(&map, pf_rows);
      if (t + 3 + pf < num_tiles)
        pf_rows = BoxRow(p, g, table, kb + (t + 3 + pf) * kKeys, lane, ke);
    }
  }

  if (stamps != nullptr && tid == 0) WritePhaseStamp(stamps, kMlaPhaseLastMath);
  // Row sums: warpgroup 0's, through the (now idle) P buffer.
  float l[2];
  ShareWg0RowSums(reinterpret_cast<float*>(smem + kPOff), wg, t4, row_lo, l_run, l);
  StoreWgRows(p, split, q0, r0, rows_seq, row_lo, wg, t4, o, l, m_run,
              merge ? filled == 1 : p.num_splits == 1);
  if (stamps != nullptr && tid == 0) WritePhaseStamp(stamps, kMlaPhaseStored);
  if (merge && filled > 1) MergeInKernel<kRows>(p, c, filled, smem + kTileBytes, stamps);
#endif
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
                          dim3 grid, bool hand_off, cudaStream_t stream) {
  using tma_kernel::MlaTmaKernel;
  if (p.phase_stamps != nullptr) {  // kPrefetch's instantiation also runs pf = 0
    return hand_off ? tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, true, true, true>, p, cache,
                                                     layer, grid, stream)
                    : tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, false, true, true>, p, cache,
                                                     layer, grid, stream);
  }
  if (p.l2_prefetch_tiles > 0) {
    return hand_off ? tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, true, true>, p, cache, layer,
                                                     grid, stream)
                    : tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, false, true>, p, cache, layer,
                                                     grid, stream);
  }
  return hand_off ? tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, true, false>, p, cache, layer,
                                                   grid, stream)
                  : tma_kernel::LaunchTmaKernel<T>(MlaTmaKernel<T, false, false>, p, cache, layer,
                                                   grid, stream);
}

template absl::Status LaunchMlaTma<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                                  const DeviceKvCache&, int64_t, dim3, bool,
                                                  cudaStream_t);
template absl::Status LaunchMlaTma<__half>(const LatentParams<__half>&, const DeviceKvCache&,
                                           int64_t, dim3, bool, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
