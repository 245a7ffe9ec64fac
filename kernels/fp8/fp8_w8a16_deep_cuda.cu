// The batch-1 weight-only FP8 GEMV's latency forms (Fp8W16Math::kTensorCoreDeep /
// kTensorCoreSplitK / kTensorCorePersistent, fp8_w8a16_gemv_cuda.h): the tensor-core kernel
// (Fp8W16MmaKernel, fp8_w8a16_gemv_cuda.cu) with more weight bytes in flight on the shapes whose
// 16-row tiles do not fill the GPU (Llama-3-8B's o / down_proj, n = 4096: 256 CTAs = 0.48 waves on
// an H200, ncu DRAM 54-56%, BENCHMARKS.md).
//
//   Deep:   the same tile and arithmetic with 2 kLoads 16-byte loads in flight a lane (G = 8
//           groups for R = 1, 4 for SiLU-and-mul's R = 2), __launch_bounds__ for 2 CTAs an SM
//           (<= 128 registers). Bits: kTensorCore's (the same mma order into the same
//           accumulators; only the load schedule differs).
//   Persistent: the deep kernel's tiles on min(tiles, 2 SMs) CTAs, each walking tiles b,
//           b + gridDim.x, ... with the activations (kNormIn: the RmsNorm) staged once a CTA
//           rather than once a tile. Bits: kTensorCore's.
//   SplitK: S CTAs a tile (gridDim.y = S), CTA s taking the chunks [s share, (s + 1) share) of
//           k (share a multiple of 128 columns, so the grouped scales line up), each writing its
//           16 (x R) fp32 tile sums into the caller's workspace; the last CTA of the tile to take
//           a ticket (atomicInc on the tile's counter, wrapping back to 0: graph replays find it
//           zero) adds the S partials in the fixed order s = 0 .. S - 1 and runs StoreRow.
//           Deterministic run to run, not bit-identical to kTensorCore (another sum order).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {
namespace {

constexpr int kDeepLoads = 2 * kLoads;

// Fp8W16MmaKernel with kDeepLoads in flight a lane. (The names start with "Fp8W16MmaKernel": the
// step breakdown, runtime/cuda/step_breakdown.cc, classes them as the tensor-core kernel.)
template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelDeep(Args p, TOut* __restrict__ out) {
  TileKernelBody<TOut, R, kFold, kGrouped>(p, out, [&](const auto& row_of, auto& partial) {
    MmaTilePartialsOf<R, kFold, kGrouped, kDeepLoads, false>(p, row_of, partial, ChunkRange{0, 0});
  });
}

// Fp8W16MmaKernelDeep's tiles on a persistent grid: CTA b takes the tiles b, b + gridDim.x, ...
// The first tile's first G groups are loaded before the PDL wait (p.early), the activations
// (kNormIn: the RmsNorm) staged once a CTA, each next tile's first G groups loaded as soon as the
// previous tile's products are done (before its partials' barrier and epilogue). Per tile the
// deep kernel's arithmetic, hence kTensorCore's bits. partial alternates between two buffers:
// tile i + 2 writes buffer i % 2 only after the barrier of tile i + 1, which warp 0 reaches after
// its epilogue of tile i read it.
template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelPersistent(Args p, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  constexpr int G = kDeepLoads / (2 * R);
  __shared__ float partial[2][kWarps][R][kMmaRows];
  extern __shared__ uint4 w16_smem[];  // f16 activations [k] (kNormIn: then the norm weight [k])
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = static_cast<int>(p.k / 16), c0 = warp * 4 + lane % 4;
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const uint4* wrow[R][2];
  const float* srow[R][2];  // kGrouped
  uint4 buf[G][R][2];
  float sc[kGrouped ? G : 1][R][2];
  int64_t tile = blockIdx.x;
  PersistentStart<R, kGrouped, G>(p, lane, c0, chunks, wrow, srow, buf, sc);
  StageActivationsF16<kFold>(p, w16_smem);  // once a CTA (barrier after)
  for (int i = 0; tile < tiles; ++i) {
    float acc[R][4];
    MmaTileGroups<R, kGrouped, G>(wrow, srow, w16_smem, warp, c0, chunks, buf, sc, acc);
    const int64_t next = tile + gridDim.x;
    if (next < tiles) {  // the next tile's first groups in flight across the epilogue
      PersistentTileRows<R>(p, next, lane, wrow, srow);
      LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
    }
    WriteTilePartials<R>(acc, warp, lane, partial[i & 1]);
    __syncthreads();
    const int64_t row = tile * kMmaRows + threadIdx.x;
    if (threadIdx.x < kMmaRows && row < p.n) {
      float dot[R];
      SumPartials<R>(partial[i & 1], threadIdx.x, dot);
      StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out);
    }
    tile = next;
  }
}

// The split-k kernels' share of the caller's workspace.
struct SplitArgs {
  float* partials;         // [tiles, S, R, 16]
  unsigned int* counters;  // [tiles]
  int share;               // chunks a split (a multiple of kScaleGroupChunks)
};

// True (in every thread) in the last of the tile's gridDim.y CTAs to arrive, whose partial
// stores and every other split's are then visible to it (paged_decode_merge.cuh's
// TakeMergeTicket): atomicInc wraps the counter from S - 1 back to 0.
__device__ __forceinline__ bool TakeTileTicket(unsigned int* counter, int* flag) {
  __threadfence();  // this thread's partial stores, device-wide, before the ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int last = gridDim.y - 1;
    const unsigned int ticket = atomicInc(counter, last);
    __threadfence();
    *flag = ticket == last;
  }
  __syncthreads();
  return *flag != 0;
}

template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32)
    Fp8W16MmaKernelSplitK(Args p, SplitArgs sk, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  __shared__ float partial[kWarps][R][kMmaRows];
  __shared__ int last_flag;
  const int64_t tile = blockIdx.x, row0 = tile * kMmaRows;
  const auto row_of = [&](int j, int r) -> int64_t {  // past n: row 0 (not stored)
    const int64_t r0 = row0 + j;
    return r0 < p.n ? r0 + r * p.n : 0;
  };
  const int chunks = static_cast<int>(p.k / 16), begin = static_cast<int>(blockIdx.y) * sk.share;
  MmaTilePartialsOf<R, kFold, kGrouped, kLoads, true>(
      p, row_of, partial, ChunkRange{begin, min(begin + sk.share, chunks)});
  // After the PDL wait (in MmaTilePartialsOf): the previous user of the workspace has finished.
  float* tile_partials = sk.partials + tile * gridDim.y * (R * kMmaRows);
  const unsigned j = threadIdx.x;
  if (j < kMmaRows) {
    float dot[R];
    SumPartials<R>(partial, j, dot);
#pragma unroll
    for (int r = 0; r < R; ++r) tile_partials[(blockIdx.y * R + r) * kMmaRows + j] = dot[r];
  }
  if (!TakeTileTicket(sk.counters + tile, &last_flag)) return;
  const int64_t row = row0 + j;
  if (j >= kMmaRows || row >= p.n) return;
  float dot[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    dot[r] = 0.0f;
    for (unsigned s = 0; s < gridDim.y; ++s) {  // fixed order: the same bits every run
      dot[r] += __ldcg(tile_partials + (s * R + r) * kMmaRows + j);
    }
  }
  StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out);
}

template <typename Kernel, typename... KernelArgs>
absl::Status LaunchWith(Kernel kernel, cudaLaunchConfig_t& config, KernelArgs... args) {
  RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, args...));
  return absl::OkStatus();
}

}  // namespace

int SplitKShare(int64_t tiles, int64_t k, const Fp8W16SplitKWorkspace& ws, int sms, int* splits) {
  const int64_t units = (k / 16 + kScaleGroupChunks - 1) / kScaleGroupChunks;  // 128 columns
  int s = ws.splits;
  if (s <= 0) {  // S CTAs a tile while the grid stays within one wave of resident CTAs
    s = 1;
    for (const int c : {4, 2}) {
      if (tiles * c <= int64_t{sms} * kSplitKResidentCtas && k >= c * kSplitKMinColumns) {
        s = c;
        break;
      }
    }
  }
  s = static_cast<int>(std::min<int64_t>({s, kFp8W16MaxSplits, units}));
  const int64_t share_units = (units + s - 1) / s;
  *splits = static_cast<int>((units + share_units - 1) / share_units);  // none empty
  return static_cast<int>(share_units * kScaleGroupChunks);
}

template <typename TOut, int R, Fold kFold>
absl::Status LaunchDeep(const Args& p, TOut* out, cudaStream_t stream, bool pdl, bool grouped) {
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>((p.n + kMmaRows - 1) / kMmaRows)), dim3(kWarps * 32), stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>((kFold == Fold::kNormIn ? 2 : 1) * p.k * 2);
  if (grouped) return LaunchWith(Fp8W16MmaKernelDeep<TOut, R, kFold, true>, config, p, out);
  return LaunchWith(Fp8W16MmaKernelDeep<TOut, R, kFold, false>, config, p, out);
}

template <typename TOut, int R, Fold kFold>
absl::Status LaunchPersistent(const Args& p, TOut* out, cudaStream_t stream, bool pdl,
                              bool grouped) {
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{2} * sms))), dim3(kWarps * 32),
      stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>((kFold == Fold::kNormIn ? 2 : 1) * p.k * 2);
  if (grouped) return LaunchWith(Fp8W16MmaKernelPersistent<TOut, R, kFold, true>, config, p, out);
  return LaunchWith(Fp8W16MmaKernelPersistent<TOut, R, kFold, false>, config, p, out);
}

template <typename TOut, int R, Fold kFold>
absl::StatusOr<bool> LaunchSplitK(const Args& p, TOut* out, cudaStream_t stream, bool pdl,
                                  bool grouped, const Fp8W16SplitKWorkspace& ws) {
  int device = 0, sms = 0, splits = 1;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const int share = SplitKShare(tiles, p.k, ws, sms, &splits);
  if (splits < 2 || ws.partials == nullptr || ws.counters == nullptr || tiles > ws.tiles) {
    return false;  // the caller runs kTensorCore
  }
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), dim3(kWarps * 32), stream,
      pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  // kNormIn stages the whole normalised row (and the norm weight); else the share's f16.
  config.dynamicSmemBytes =
      static_cast<size_t>(kFold == Fold::kNormIn ? 4 * p.k : int64_t{share} * 16 * 2);
  const SplitArgs sk{ws.partials, ws.counters, share};
  if (grouped) {
    RETURN_IF_ERROR(LaunchWith(Fp8W16MmaKernelSplitK<TOut, R, kFold, true>, config, p, sk, out));
  } else {
    RETURN_IF_ERROR(LaunchWith(Fp8W16MmaKernelSplitK<TOut, R, kFold, false>, config, p, sk, out));
  }
  return true;
}

#define TANDEM_W16_LATENCY_FORMS(TOut, R, kFold)                                                  \
  template absl::Status LaunchDeep<TOut, R, kFold>(const Args&, TOut*, cudaStream_t, bool, bool); \
  template absl::Status LaunchPersistent<TOut, R, kFold>(const Args&, TOut*, cudaStream_t, bool,  \
                                                         bool);                                   \
  template absl::StatusOr<bool> LaunchSplitK<TOut, R, kFold>(                                     \
      const Args&, TOut*, cudaStream_t, bool, bool, const Fp8W16SplitKWorkspace&);
TANDEM_W16_TILE_FORMS(TANDEM_W16_LATENCY_FORMS)
#undef TANDEM_W16_LATENCY_FORMS

}  // namespace tandem::kernels::cuda::fp8_w16_internal

namespace tandem::kernels::cuda {
namespace {

int64_t SplitKTiles(int64_t weight_rows) {
  return (weight_rows + fp8_w16_internal::kMmaRows - 1) / fp8_w16_internal::kMmaRows;
}
int64_t SplitKPartialFloats(int64_t weight_rows) {
  return SplitKTiles(weight_rows) * kFp8W16MaxSplits * 2 * fp8_w16_internal::kMmaRows;
}

}  // namespace

int64_t Fp8W16SplitKWorkspaceBytes(int64_t weight_rows) {
  return SplitKPartialFloats(weight_rows) * 4 + SplitKTiles(weight_rows) * 4;
}

Fp8W16SplitKWorkspace Fp8W16SplitKWorkspaceAt(void* base, int64_t weight_rows, int splits) {
  Fp8W16SplitKWorkspace ws;
  ws.partials = static_cast<float*>(base);
  ws.counters = reinterpret_cast<unsigned int*>(ws.partials + SplitKPartialFloats(weight_rows));
  ws.tiles = SplitKTiles(weight_rows);
  ws.splits = splits;
  return ws;
}

}  // namespace tandem::kernels::cuda
