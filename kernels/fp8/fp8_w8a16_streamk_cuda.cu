// The batch-1 weight-only FP8 GEMV's stream-K form (Fp8W16Math::kTensorCoreStreamK,
// fp8_w8a16_gemv_cuda.h): the deep tensor-core tiles (fp8_w8a16_deep_cuda.cu) without the partial
// last wave. Llama-3-8B's gate_up (896 16-row tiles) on 2 deep CTAs x 132 SMs is 3.39 waves, the
// last a third full (BENCHMARKS.md, fourteenth session).
//
// Work: a tile's k in units of 128 columns (U = ceil(k / 128) a tile, the grouped scales' groups,
// SplitKShare's units), W = tiles x U units in tile-major order, split into C = min(tiles, 2 SMs)
// equal contiguous ranges, CTA b taking units [b W / C, (b + 1) W / C). The CTA walks its range a
// tile at a time ("pieces"): the deep kernel's product over the piece's chunks (a ChunkRange of
// k: the split-k form's row offsets, the activations staged once a CTA for the whole k, kNormIn's
// RmsNorm included). A range holds at least U units (C <= tiles), so a tile is cut between at most
// two CTAs: the end of b's range (piece 0) and the start of b + 1's (piece 1).
//   Whole tile: SumPartials + StoreRow as the deep kernel (its bits: the same groups a warp, the
//           same mma order, the same warp order).
//   Cut tile: each piece's 16 (x R) fp32 sums into the split-k workspace at (tile, piece), a
//           ticket on the tile's counter (TakeTileTicket, wrapping 1 -> 0), the second to arrive
//           adding piece 0 then piece 1 (fixed order: the same bits every run, not the deep
//           kernel's) and running StoreRow.
// The next piece's first G groups are loaded before the previous piece's epilogue (as the
// persistent form's next tile); `partial` alternates between two buffers (the persistent form's
// argument: piece i + 2 writes buffer i % 2 after the barrier of piece i + 1, which warp 0 reaches
// after its epilogue of piece i read it).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {
namespace {

// The stream-K plan (LaunchStreamK) and its share of the split-k workspace.
struct StreamKArgs {
  float* partials;         // [tiles, 2 pieces, R, 16] (inside the workspace's [tiles, 4, 2, 16])
  unsigned int* counters;  // [tiles]
  int units;               // W = tiles x tile_units (< 2^31: LaunchStreamK)
  int tile_units;          // U: 128-column units of k (the last one partial when k % 128 != 0)
};

// One CTA's share of one tile: its units [lo, hi) of the tile's U.
struct Piece {
  int tile, lo, hi;
};

// The piece of the tile holding unit u of a range ending at unit `end` (u < end).
__device__ __forceinline__ Piece PieceAt(int u, int end, int tile_units) {
  const int tile = u / tile_units, first = tile * tile_units;
  return Piece{tile, u - first, min(end - first, tile_units)};
}

// The chunks (16 columns) of k a piece covers.
__device__ __forceinline__ ChunkRange ChunksOf(const Piece& q, int chunks) {
  return ChunkRange{q.lo * kScaleGroupChunks, min(q.hi * kScaleGroupChunks, chunks)};
}

// The output of the tile's rows from the warps' partials of this CTA's piece q (every thread of
// the block calls it): a whole tile stores its rows; a cut one stores its sums at (tile, piece),
// and the second piece to arrive adds both in piece order and stores the rows.
template <typename TOut, int R, Fold kFold, bool kGrouped>
__device__ __forceinline__ void PieceEpilogue(const Args& p, const StreamKArgs& sk, const Piece& q,
                                              const float (&partial)[kWarps][R][kMmaRows],
                                              int* last_flag, TOut* __restrict__ out) {
  const unsigned j = threadIdx.x;
  const int64_t row = int64_t{q.tile} * kMmaRows + j;
  float dot[R];
  if (q.lo == 0 && q.hi == sk.tile_units) {  // whole: the deep kernel's epilogue
    if (j < kMmaRows && row < p.n) {
      SumPartials<R>(partial, j, dot);
      StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out);
    }
    return;
  }
  float* tile_partials = sk.partials + int64_t{q.tile} * (2 * R * kMmaRows);
  if (j < kMmaRows) {
    const int piece = q.lo > 0 ? 1 : 0;  // the range's start cuts the tile: its second piece
    SumPartials<R>(partial, j, dot);
#pragma unroll
    for (int r = 0; r < R; ++r) tile_partials[(piece * R + r) * kMmaRows + j] = dot[r];
  }
  // After the PDL wait: the previous user of the workspace has finished.
  if (!TakeTileTicket<2>(sk.counters + q.tile, last_flag)) return;
  if (j >= kMmaRows || row >= p.n) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    dot[r] = 0.0f;
#pragma unroll
    for (int piece = 0; piece < 2; ++piece) {  // fixed order: the same bits every run
      dot[r] += __ldcg(tile_partials + (piece * R + r) * kMmaRows + j);
    }
  }
  StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out);
}

template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelStreamK(Args p, StreamKArgs sk, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  constexpr int G = kDeepLoads / (2 * R);
  __shared__ float partial[2][kWarps][R][kMmaRows];
  __shared__ int last_flag;
  extern __shared__ uint4 w16_smem[];  // f16 activations [k] (kNormIn: then the norm weight [k])
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = static_cast<int>(p.k / 16), c0 = warp * 4 + lane % 4;
  const int end = static_cast<int>((int64_t{blockIdx.x} + 1) * sk.units / gridDim.x);
  const uint4* wrow[R][2];
  const float* srow[R][2];  // kGrouped
  uint4 buf[G][R][2];
  float sc[kGrouped ? G : 1][R][2];
  const auto rows_of = [&](const Piece& q) {  // the piece's rows from its first chunk on
    const int64_t row0 = int64_t{q.tile} * kMmaRows;
    const auto row_of = [&](int j, int r) -> int64_t {  // past n: row 0 (not stored)
      const int64_t r0 = row0 + j;
      return r0 < p.n ? r0 + r * p.n : 0;
    };
    TileRowsOf<R, true>(p, row_of, lane, ChunksOf(q, chunks).begin, wrow, srow);
  };
  Piece q =
      PieceAt(static_cast<int>(int64_t{blockIdx.x} * sk.units / gridDim.x), end, sk.tile_units);
  ChunkRange range = ChunksOf(q, chunks);
  rows_of(q);
  if (p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, range.end - range.begin, buf, sc);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early) LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, range.end - range.begin, buf, sc);
  StageActivationsF16<kFold>(p, w16_smem);  // once a CTA, the whole k (barrier after)
  for (int i = 0;; ++i) {
    float acc[R][4];
    MmaTileGroups<R, kGrouped, G>(wrow, srow, w16_smem + 2 * range.begin, warp, c0,
                                  range.end - range.begin, buf, sc, acc);
    const int next_unit = (q.tile + 1) * sk.tile_units;
    const Piece next = next_unit < end ? PieceAt(next_unit, end, sk.tile_units) : q;
    const ChunkRange next_range = ChunksOf(next, chunks);
    if (next_unit < end) {  // the next piece's first groups in flight across the epilogue
      rows_of(next);
      LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, next_range.end - next_range.begin, buf, sc);
    }
    WriteTilePartials<R>(acc, warp, lane, partial[i & 1]);
    __syncthreads();
    PieceEpilogue<TOut, R, kFold, kGrouped>(p, sk, q, partial[i & 1], &last_flag, out);
    if (next_unit >= end) break;
    q = next;
    range = next_range;
  }
}

}  // namespace

template <typename TOut, int R, Fold kFold>
absl::StatusOr<bool> LaunchStreamK(const Args& p, TOut* out, cudaStream_t stream, bool pdl,
                                   bool grouped, const Fp8W16SplitKWorkspace& ws) {
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const int tile_units = static_cast<int>((p.k / 16 + kScaleGroupChunks - 1) / kScaleGroupChunks);
  if (ws.partials == nullptr || ws.counters == nullptr || tiles > ws.tiles ||
      tiles * tile_units > int64_t{INT32_MAX}) {  // the units counted in 32 bits
    return false;                                 // the caller runs kTensorCoreDeep
  }
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // C <= tiles: every range holds >= U units, so a tile meets at most two CTAs.
  const int64_t ctas = std::min<int64_t>(tiles, int64_t{2} * sms);
  const internal::PdlLaunchConfig pdl_config(dim3(static_cast<unsigned>(ctas)), dim3(kWarps * 32),
                                             stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>((kFold == Fold::kNormIn ? 2 : 1) * p.k * 2);
  const StreamKArgs sk{ws.partials, ws.counters, static_cast<int>(tiles * tile_units), tile_units};
  if (grouped) {
    RETURN_IF_ERROR(LaunchWith(Fp8W16MmaKernelStreamK<TOut, R, kFold, true>, config, p, sk, out));
  } else {
    RETURN_IF_ERROR(LaunchWith(Fp8W16MmaKernelStreamK<TOut, R, kFold, false>, config, p, sk, out));
  }
  return true;
}

#define TANDEM_W16_STREAMK(TOut, R, kFold)                     \
  template absl::StatusOr<bool> LaunchStreamK<TOut, R, kFold>( \
      const Args&, TOut*, cudaStream_t, bool, bool, const Fp8W16SplitKWorkspace&);
TANDEM_W16_STREAMK(bf16, 1, Fold::kNone)
TANDEM_W16_STREAMK(float, 1, Fold::kNone)
TANDEM_W16_STREAMK(bf16, 1, Fold::kNormIn)
TANDEM_W16_STREAMK(bf16, 2, Fold::kNormIn)
TANDEM_W16_STREAMK(bf16, 1, Fold::kAddOut)
#undef TANDEM_W16_STREAMK

}  // namespace tandem::kernels::cuda::fp8_w16_internal
