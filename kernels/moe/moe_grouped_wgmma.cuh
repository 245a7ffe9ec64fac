// MoeGroupedWgmma's internals shared by moe_grouped_wgmma_cuda.cu (internal; included there
// only): the tile shapes and the per-CTA tile table, the kernel's parameters, and the consumer
// warpgroups of its three schedules (MoeWgmmaSchedule): Consume (kCooperative), ConsumePingPong
// (kPingPong) and ConsumeWide (kCooperative128x256's 128 x 256 tiles), all wgmma m64n128k16 with
// both operands in shared memory (128-byte swizzle, kernels/attention/cuda/prefill_wgmma.cuh) and
// fp32 accumulators stored as bf16 / fp16 pairs.
#ifndef TANDEM_KERNELS_MOE_MOE_GROUPED_WGMMA_CUH_
#define TANDEM_KERNELS_MOE_MOE_GROUPED_WGMMA_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {
// A named namespace, not an anonymous one: the compute_90 PTX pass compiles no kernel body
// (wgmma is sm_90a only), and nvcc would reject the then-unused helpers as unreferenced.
namespace moe_wgmma_internal {

using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::SmemAddr;
using internal::prefill::FenceOperand;
using internal::prefill::FenceProxyAsync;
using internal::prefill::MbarArrive;
using internal::prefill::MbarArriveIf;
using internal::prefill::MbarInit;
using internal::prefill::MbarWait;
using internal::prefill::SmemDesc;
using internal::prefill::WgmmaCommit;
using internal::prefill::WgmmaFence;
using internal::prefill::WgmmaSS128;
using internal::prefill::WgmmaWait;
using Producer = MoeWgmmaProducer;

inline constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
inline constexpr int kBK = 64;        // k columns per stage: one 128-byte swizzled row per tile row

// Tile shapes: k128x128 (the cooperative consumer warpgroups stacked in rows), k64x256 (side by
// side), k128x256 (each cooperative warpgroup 64 x 256 as two 64 x 128 accumulator blocks).
enum Shape : int { k64x256 = 1, k128x128 = 2, k128x256 = 3 };
template <int kShape>
struct Tile {
  static constexpr int kBM = kShape == k64x256 ? 64 : 128;
  static constexpr int kBN = kShape == k128x128 ? 128 : 256;
  static constexpr int kBOff = kBM * 128;  // the weight rows' block inside a stage
  static constexpr int kStageBytes = (kBM + kBN) * 128;
  // 192 / 200 / 192 KiB of ring.
  static constexpr int kStages = kShape == k128x128 ? 6 : kShape == k64x256 ? 5 : 4;
  static constexpr int kBarOff = kStages * kStageBytes;
  // full[kStages], empty[kStages], turn[2] (the ping-pong schedule's hand-over).
  static constexpr int kTableOff = kBarOff + (2 * kStages + 2) * 8;
  static constexpr int kTableInts = static_cast<int>(kMoeMaxExperts) + 1;
  // Ring + barriers + two tables of E + 1 ints + slack for the 1024-byte alignment.
  static constexpr int kSmemBytes = kTableOff + 2 * kTableInts * 4 + 1024;
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(kStages >= 4, "two batches in flight + one released late need >= 4 stages");
};

struct TileRef {
  int expert, row0, row_end, n0;
};

// Warp 0 writes start[e] = the first tile of expert e (start[E] = all tiles; an expert of c rows
// has ceil(c / bm) x n_tiles tiles) and offs[e] = offsets[e], 32 experts per inclusive scan.
__device__ void BuildTileTable(const int32_t* __restrict__ offsets, int num_experts, int bm,
                               int n_tiles, int* start, int* offs) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int before = 0;
  for (int e0 = 0; e0 < num_experts; e0 += 32) {
    const int e = e0 + lane;
    int count = 0;
    if (e < num_experts) {
      offs[e] = offsets[e];
      count = offsets[e + 1] - offs[e];
    }
    const int tiles = (count + bm - 1) / bm * n_tiles;
    int incl = tiles;
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (e < num_experts) start[e] = before + incl - tiles;
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) {
    start[num_experts] = before;
    offs[num_experts] = offsets[num_experts];
  }
}

// Tile t < start[E]: its expert (the last e with start[e] <= t: never an empty one), then m-tile
// fastest inside the expert.
template <int kBM, int kBN>
__device__ __forceinline__ TileRef FindTile(int t, const int* start, const int* offs,
                                            int num_experts) {
  int lo = 0, hi = num_experts;  // start[lo] <= t < start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int begin = offs[lo], end = offs[lo + 1];
  const int m_tiles = (end - begin + kBM - 1) / kBM;
  const int local = t - start[lo];
  const int nt = local / m_tiles;
  return {lo, begin + (local - nt * m_tiles) * kBM, end, nt * kBN};
}

struct Params {
  // kTmaWeights / kTmaOperands: the weights as [E][n][k], boxes 64 x kBN x 1; with kGlu as
  // [E][2][n / 2][k], boxes 64 x kBN / 2 x 1 x 1 (a tile's gate rows, then its up rows).
  CUtensorMap wmap;
  CUtensorMap amap;  // kTmaOperands without a gather: A as [rows][k], boxes of 64 x kBM
  const void* a;
  const int32_t* a_row_index;
  const void* w;
  const int32_t* offsets;
  void* out;
  // The kernels' kGlu (MoeGroupedWgmmaGateUpSilu, a template parameter so that the plain kernels
  // are the code they were before it): w is gate_up [E][n][k] (n = 2 x inter); a 256-column tile
  // holds 128 gate columns and the same 128 up columns, and out [rows][n / 2] gets
  // round(silu(g) * u).
  int num_experts, n, k;
};

template <typename T>
__device__ __forceinline__ void StorePair(T* dst, float x, float y) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
  } else {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
  }
}

// A consumer warpgroup's 64 x 128 block of accumulators at (row_off, col_off) of tile tr into
// out; rows past the expert's and columns past n are not stored. Accumulator layout (m64nNk16,
// fp32): row warp * 16 + lane / 4 + 8 h, column 8 f + 2 (lane % 4) + {0, 1} in
// acc[4 f + 2 h + {0, 1}].
template <typename T>
__device__ __forceinline__ void StoreBlock(const float (&acc)[64], const Params& p,
                                           const TileRef& tr, int row_off, int col_off) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  T* out = static_cast<T*>(p.out);
  const int col0 = tr.n0 + col_off + (lane & 3) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = tr.row0 + row_off + warp * 16 + (lane >> 2) + 8 * h;
    if (r >= tr.row_end) continue;
    T* dst = out + static_cast<int64_t>(r) * p.n;
#pragma unroll
    for (int f = 0; f < 16; ++f) {
      if (col0 + 8 * f < p.n)
        StorePair(dst + col0 + 8 * f, acc[4 * f + 2 * h], acc[4 * f + 2 * h + 1]);
    }
  }
}

// MoeSiluAndMul's expression on the fp32 sums: gate and up rounded to T first (bit-identical to
// storing gate_up and running MoeSiluAndMul).
template <typename T>
__device__ __forceinline__ float SiluMul(float g, float u) {
  const float gr = internal::ToFloat<T>(internal::FromFloat<T>(g));
  const float ur = internal::ToFloat<T>(internal::FromFloat<T>(u));
  return gr / (1.0f + expf(-gr)) * ur;
}

// The glu epilogue of a warpgroup's two 64 x 128 blocks (acc[0] the gate columns, acc[1] the same
// up columns: one thread holds both of an output) at row_off of tile tr: out [rows][n / 2], the
// tile's 128 output columns from n0 / 2; rows past the expert's and columns past n / 2 not stored.
template <typename T>
__device__ __forceinline__ void StoreGlu(const float (&acc)[2][64], const Params& p,
                                         const TileRef& tr, int row_off) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int inter = p.n >> 1;
  T* out = static_cast<T*>(p.out);
  const int col0 = (tr.n0 >> 1) + (lane & 3) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = tr.row0 + row_off + warp * 16 + (lane >> 2) + 8 * h;
    if (r >= tr.row_end) continue;
    T* dst = out + static_cast<int64_t>(r) * inter;
#pragma unroll
    for (int f = 0; f < 16; ++f) {
      const int i = 4 * f + 2 * h;
      if (col0 + 8 * f < inter) {
        StorePair(dst + col0 + 8 * f, SiluMul<T>(acc[0][i], acc[1][i]),
                  SiluMul<T>(acc[0][i + 1], acc[1][i + 1]));
      }
    }
  }
}

// A consumer warpgroup (wg 0 or 1) of the cooperative schedule: 64 x 128 of every tile.
template <typename T, int kShape, Producer kProducer>
__device__ void Consume(const Params& p, const int* start, const int* offs, uint32_t ring,
                        uint64_t* full, uint64_t* empty) {
  using C = Tile<kShape>;
  const int ctid = threadIdx.x - 128;
  const int wg = ctid >> 7, lane = ctid & 31;
  const int row_off = kShape == k128x128 ? wg * 64 : 0, col_off = kShape == k128x128 ? 0 : wg * 128;
  const uint32_t a_base = ring + row_off * 128, b_base = ring + C::kBOff + col_off * 128;
  const int ktiles = (p.k + kBK - 1) / kBK;
  uint32_t step = 0;
  float acc[64];
  for (int t = blockIdx.x; t < start[p.num_experts]; t += gridDim.x) {
    const TileRef tr = FindTile<C::kBM, C::kBN>(t, start, offs, p.num_experts);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    int prev = 0;
    for (int kt = 0; kt < ktiles; ++kt, ++step) {
      const int st = step % C::kStages;
      MbarWait(full + st, (step / C::kStages) & 1);
      if constexpr (kProducer != Producer::kWaitGroup) FenceProxyAsync();
      const uint32_t so = st * C::kStageBytes;
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        WgmmaSS128<T>(acc, SmemDesc(a_base + so + kk * 32, 16, 1024),
                      SmemDesc(b_base + so + kk * 32, 16, 1024), 1u);
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the previous stage's MMAs are done: release it
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceOperand(acc[i]);
      MbarArriveIf(empty + prev, lane == 0 && kt > 0);
      prev = st;
    }
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) FenceOperand(acc[i]);
    MbarArriveIf(empty + prev, lane == 0 && ktiles > 0);
    StoreBlock<T>(acc, p, tr, row_off, col_off);
  }
}

// The main loop of a warpgroup that computes two 64 x 128 accumulator blocks of a tile from ring
// step `step` (h = 0, 1: rows a_row + 64 h of a 128 x 128 tile, or rows a_row and columns 128 h
// of a 64 x 256 or 128 x 256 one); kHalves = 1 skips the second (a 128 x 128 tile whose last 64
// rows are past the expert's), 0 both (only waiting on and releasing the stages). kHandOver (the
// ping-pong schedule): once every stage of the tile has landed (this warpgroup waited on all of
// them) it hands the turn to the other warpgroup (`turn_next`), which then issues its tile's MMAs
// while this one drains and stores.
template <typename T, int kShape, Producer kProducer, int kHalves, bool kHandOver>
__device__ __forceinline__ void TwoBlockMainLoop(float (&acc)[2][64], uint32_t ring, uint64_t* full,
                                                 uint64_t* empty, uint64_t* turn_next,
                                                 uint32_t step, int ktiles, int a_row) {
  using C = Tile<kShape>;
  constexpr uint32_t kAHalf = kShape == k128x128 ? 64 * 128 : 0;
  constexpr uint32_t kBHalf = kShape == k128x128 ? 0 : 128 * 128;
  const int lane = threadIdx.x & 31;
  int prev = 0;
  for (int kt = 0; kt < ktiles; ++kt, ++step) {
    const int st = step % C::kStages;
    MbarWait(full + st, (step / C::kStages) & 1);
    if constexpr (kProducer != Producer::kWaitGroup) FenceProxyAsync();
    const uint32_t b = ring + st * C::kStageBytes + C::kBOff;
    const uint32_t a = ring + st * C::kStageBytes + a_row * 128;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        WgmmaSS128<T>(acc[h], SmemDesc(a + h * kAHalf + kk * 32, 16, 1024),
                      SmemDesc(b + h * kBHalf + kk * 32, 16, 1024), 1u);
      }
    }
    WgmmaCommit();
    WgmmaWait<1>();  // the previous stage's MMAs are done: release it
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceOperand(acc[h][i]);
    }
    MbarArriveIf(empty + prev, lane == 0 && kt > 0);
    prev = st;
  }
  if constexpr (kHandOver) MbarArriveIf(turn_next, threadIdx.x % 128 == 0);
  WgmmaWait<0>();
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int i = 0; i < 64; ++i) FenceOperand(acc[h][i]);
  }
  MbarArriveIf(empty + prev, lane == 0 && ktiles > 0);
}

// A consumer warpgroup (wg 0 or 1) of the ping-pong schedule (CUTLASS's "pingpong"): the CTA's
// tiles alternate between the two, tile i (the i-th of this CTA) to warpgroup i % 2, each
// computing the whole tile, so one warpgroup's epilogue runs while the other's MMAs do. The
// producer fills the ring in tile order as before; a stage is consumed (and released: `empty`
// counts 4 warps) by one warpgroup. The turn barriers keep the MMAs in tile order: warpgroup w
// starts tile i > 0 only after the other has waited on every stage of tile i - 1 (turn[w]), so
// a warpgroup never waits on a ring stage two fills ahead (parity waits stay unambiguous).
template <typename T, int kShape, Producer kProducer, bool kGlu>
__device__ void ConsumePingPong(const Params& p, const int* start, const int* offs, uint32_t ring,
                                uint64_t* full, uint64_t* empty, uint64_t* turn) {
  using C = Tile<kShape>;
  const int wg = (threadIdx.x - 128) >> 7;
  const int ktiles = (p.k + kBK - 1) / kBK;
  float acc[2][64];
  uint32_t turns = 0;
  int i = wg;
  for (int t = blockIdx.x + wg * gridDim.x; t < start[p.num_experts]; t += 2 * gridDim.x, i += 2) {
    const TileRef tr = FindTile<C::kBM, C::kBN>(t, start, offs, p.num_experts);
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[0][j] = acc[1][j] = 0.0f;
    if (i > 0) MbarWait(turn + wg, turns++ & 1);
    const uint32_t step = static_cast<uint32_t>(i) * ktiles;
    const bool both = kShape == k64x256 || tr.row0 + 64 < tr.row_end;
    uint64_t* next = turn + (wg ^ 1);
    if (both) {
      TwoBlockMainLoop<T, kShape, kProducer, 2, true>(acc, ring, full, empty, next, step, ktiles,
                                                      0);
    } else {
      TwoBlockMainLoop<T, kShape, kProducer, 1, true>(acc, ring, full, empty, next, step, ktiles,
                                                      0);
    }
    if constexpr (kShape == k64x256 && kGlu) {
      StoreGlu<T>(acc, p, tr, 0);
      continue;
    }
    StoreBlock<T>(acc[0], p, tr, 0, 0);
    if (both) {
      StoreBlock<T>(acc[1], p, tr, kShape == k128x128 ? 64 : 0, kShape == k128x128 ? 0 : 128);
    }
  }
}

// A consumer warpgroup (wg 0 or 1) of the cooperative schedule on 128 x 256 tiles: rows wg * 64
// of every tile, all 256 columns, as two 64 x 128 accumulator blocks; a warpgroup whose rows are
// all past the expert's only waits on and releases the stages.
template <typename T, Producer kProducer, bool kGlu>
__device__ void ConsumeWide(const Params& p, const int* start, const int* offs, uint32_t ring,
                            uint64_t* full, uint64_t* empty) {
  using C = Tile<k128x256>;
  const int row_off = ((threadIdx.x - 128) >> 7) * 64;
  const int ktiles = (p.k + kBK - 1) / kBK;
  float acc[2][64];
  uint32_t step = 0;
  for (int t = blockIdx.x; t < start[p.num_experts]; t += gridDim.x, step += ktiles) {
    const TileRef tr = FindTile<C::kBM, C::kBN>(t, start, offs, p.num_experts);
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[0][j] = acc[1][j] = 0.0f;
    if (tr.row0 + row_off >= tr.row_end) {
      TwoBlockMainLoop<T, k128x256, kProducer, 0, false>(acc, ring, full, empty, nullptr, step,
                                                         ktiles, row_off);
      continue;
    }
    TwoBlockMainLoop<T, k128x256, kProducer, 2, false>(acc, ring, full, empty, nullptr, step,
                                                       ktiles, row_off);
    if constexpr (kGlu) {
      StoreGlu<T>(acc, p, tr, row_off);
      continue;
    }
    StoreBlock<T>(acc[0], p, tr, row_off, 0);
    StoreBlock<T>(acc[1], p, tr, row_off, 128);
  }
}
}  // namespace moe_wgmma_internal
}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_GROUPED_WGMMA_CUH_
