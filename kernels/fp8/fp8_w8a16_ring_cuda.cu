// The batch-1 weight-only FP8 GEMV's ring form (Fp8W16Math::kRing / kRing2 / kRingHalf,
// fp8_w8a16_gemv_cuda.h): the tensor-core kernel's arithmetic (Fp8W16MmaKernel, bit for bit) with
// the weight bytes streamed through a shared-memory ring by 1-d bulk copies instead of registers.
//
// Why: Fp8W16MmaKernel keeps 8 16-byte loads in flight a lane and its 16-row CTAs are few (256
// for n = 4096): on an H200 ncu showed DRAM at 54-56% of peak, 0.48 waves, 23.5% achieved
// occupancy (kernels/fp8/BENCHMARKS.md) - too few bytes in flight. Here a persistent grid
// (min(16-row tiles, SMs x CTAs an SM)) walks its tiles in order, and each CTA keeps up to
// kMaxStages stages of 16 rows x 1024 columns (R = 2: 32 rows x 512) in flight: 17-18 KiB a stage,
// ~70-200 KiB a CTA, issued by warp 0 as one 1-d bulk copy a row (cp.async.bulk, L2 evict-first,
// completing on the stage's mbarrier), so the SM's instruction issue does not limit the bytes in
// flight. The first stages are issued before the PDL wait (Args::early): weights do not depend on
// the preceding kernel. The activations are staged (and, NormIn, normalised) once a CTA, not once
// a 16-row tile.
//
// Per stage, warp w takes the stage's 64-column groups w, w + 8 (R = 1; R = 2: w), i.e. the
// groups w, w + 8, w + 16, ... of the row in order, exactly Fp8W16MmaKernel's split and order;
// the A fragments come from shared memory (a row's pitch is 1024 + 64 bytes, so rows g and g + 1
// of a quarter-warp's 16-byte reads fall on different banks), MmaGroup and StoreRow are shared,
// and the 8 warps' partials are added in the same order: the outputs are Fp8W16MmaKernel's bits.
//
// Ring protocol: full[s] (1 arrival: warp 0's expect-tx; the bulk copies' bytes), empty[s] (8
// arrivals: one a warp after it used the slot). Warp 0 refills the slot used kRefillLag stages
// earlier at the top of each stage (waiting on its empty barrier, which the other warps passed a
// stage ago), so it does not wait for the slowest warp of the stage just used. Rows past n are
// not copied (their C rows are never stored; an mma row depends on its A row only); columns
// past k are zeroed in the A fragments (stale shared memory may hold NaN codes). The waits trap
// after 2^25 polls (~1 s; MbarWaitOrTrap): a lost arrival fails the launch instead of hanging.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {
namespace {

constexpr int kRingCols = 1024;  // columns a stage holds for R = 1 (R = 2: 512 of 32 rows)
constexpr int kRingPad = 64;     // bytes after each staged row (bank spread, header comment)
constexpr int kMaxStages = 12;
constexpr int kRefillLag = 2;
constexpr int kBarBytes = 2 * kMaxStages * 8;  // full[kMaxStages], empty[kMaxStages]
// The per-SM shared memory of an H200 (sm_90: 228 KiB, 227 KiB at most a CTA), 1 KiB of it
// reserved a CTA.
constexpr int64_t kSmemPerSm = 228 * 1024, kSmemPerCta = 227 * 1024, kReservedPerCta = 1024;

template <int R>
constexpr int StageCols() {
  return kRingCols / R;
}
template <int R>
constexpr int RowPitch() {
  return StageCols<R>() + kRingPad;
}
template <int R>
constexpr int StageBytes() {
  return kMmaRows * R * RowPitch<R>();
}

// A position in this CTA's sequence of stages, advanced one stage at a time (no divisions in the
// loop): the ring slot and its fill's phase parity, the stage's k-stage in its tile and the tile
// (this CTA's tile-th: rows 16 (blockIdx.x + tile gridDim.x) ..).
struct RingPos {
  int slot = 0, kstage = 0, tile = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Next(int stages, int kstages) {
    if (++slot == stages) slot = 0, phase ^= 1;
    if (++kstage == kstages) kstage = 0, ++tile;
  }
  __device__ __forceinline__ int64_t FirstRow() const {
    return (blockIdx.x + int64_t{tile} * gridDim.x) * kMmaRows;
  }
};

// Warp 0: the stage at `at` into its slot. Lane 0 arms the full barrier with the stage's bytes
// first; then lane r * 16 + i copies row i of row set r (one bulk copy of up to 1024 bytes).
template <int R>
__device__ __forceinline__ void Fill(const Args& p, const RingPos& at, uint8_t* ring,
                                     uint64_t* full, int lane) {
  constexpr int kCols = StageCols<R>();
  const int64_t row0 = at.FirstRow(), col = int64_t{at.kstage} * kCols;
  const uint32_t bytes = static_cast<uint32_t>(min(int64_t{kCols}, p.k - col));
  const int rows = static_cast<int>(min(int64_t{kMmaRows}, p.n - row0));
  if (lane == 0) internal::MbarArriveExpectTx(full + at.slot, bytes * rows * R);
  __syncwarp();
  const int r = lane / kMmaRows, i = lane % kMmaRows;
  if (r < R && i < rows) {
    const uint8_t* src = p.w + (row0 + i + r * p.n) * p.k + col;
    uint8_t* dst = ring + at.slot * StageBytes<R>() + lane * RowPitch<R>();
    internal::BulkLoad1dEvictFirst(internal::SmemAddr(dst), src, bytes, full + at.slot);
  }
}

// acc += this warp's groups of the stage in `st` whose first column is stage_chunk * 16.
template <int R>
__device__ __forceinline__ void UseStage(const uint8_t* st, const uint4* act16, int stage_chunk,
                                         int chunks, int warp, int lane, float (&acc)[R][4]) {
  constexpr int kGroups = StageCols<R>() / 64 / kWarps;  // a warp's groups a stage: 2 / 1
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int grp = warp + kWarps * q;           // 64-column group of the stage
    if (stage_chunk + 4 * grp >= chunks) break;  // warp-uniform: mma.sync needs every lane
    const int within = 4 * grp + (lane & 3);     // the lane's chunk in the stage
    const int c = stage_chunk + within;
    uint4 wv[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int srow = r * kMmaRows + (lane >> 2) + 8 * h;
        wv[r][h] = c < chunks
                       ? *reinterpret_cast<const uint4*>(st + srow * RowPitch<R>() + within * 16)
                       : make_uint4(0, 0, 0, 0);
      }
    }
    MmaGroup<R>(wv, act16, c, chunks, acc);
  }
}

template <typename TOut, int R, Fold kFold>
__global__ void __launch_bounds__(kWarps * 32)
    Fp8W16RingKernel(Args p, int stages, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  constexpr int kCols = StageCols<R>();
  __shared__ float partial[2][kWarps][R][kMmaRows];      // by tile parity: one barrier a tile
  extern __shared__ __align__(128) uint8_t ring_smem[];  // barriers, ring, activations
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_smem);
  uint64_t* empty = full + kMaxStages;
  uint8_t* ring = ring_smem + kBarBytes;
  uint4* act16 = reinterpret_cast<uint4*>(ring + stages * StageBytes<R>());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles = static_cast<int>((p.n + kMmaRows - 1) / kMmaRows);
  const int kstages = static_cast<int>((p.k + kCols - 1) / kCols);
  const int total = (tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x * kstages;
  const int chunks = static_cast<int>(p.k / 16);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      internal::MbarInit(full + s, 1);
      internal::MbarInit(empty + s, kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Warp 0 fills the first min(stages, total) stages, then refills as the warps free slots.
  RingPos fill;
  int filled = 0;
  const auto fill_next = [&] {
    Fill<R>(p, fill, ring, full, lane);
    fill.Next(stages, kstages);
    ++filled;
  };
  const int first = min(stages, total);
  if (p.early && warp == 0) {
    while (filled < first) fill_next();
  }
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early && warp == 0) {
    while (filled < first) fill_next();
  }
  StageActivationsF16<kFold>(p, act16);
  float acc[R][4] = {};
  RingPos use;
  for (int j = 0; j < total; ++j, use.Next(stages, kstages)) {
    // The refill's slot was used at stage filled - stages <= j - kRefillLag, one fill earlier:
    // its empty barrier's phase of that use has the parity opposite to this fill's.
    if (warp == 0 && filled < total && filled - stages <= j - kRefillLag) {
      internal::MbarWaitOrTrap(empty + fill.slot, fill.phase ^ 1);
      fill_next();
    }
    internal::MbarWaitOrTrap(full + use.slot, use.phase);
    UseStage<R>(ring + use.slot * StageBytes<R>(), act16, use.kstage * (kCols / 16), chunks, warp,
                lane, acc);
    __syncwarp();
    if (lane == 0) internal::MbarArrive(empty + use.slot);
    if (use.kstage != kstages - 1) continue;
    // The tile's last stage: the warps' partials (C's column 0: rows g in c[0], g + 8 in c[2])
    // added in warp order, as Fp8W16MmaKernel does.
    const int parity = use.tile & 1;
    if (lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        partial[parity][warp][r][lane / 4] = acc[r][0];
        partial[parity][warp][r][lane / 4 + 8] = acc[r][2];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
    __syncthreads();
    const int64_t row = use.FirstRow() + threadIdx.x;
    if (threadIdx.x < kMmaRows && row < p.n) {
      float dot[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        dot[r] = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) dot[r] += partial[parity][w][r][threadIdx.x];
      }
      StoreRow<TOut, R, kFold>(p, row, dot, 1.0f, out);
    }
  }
}

int64_t DynamicBytes(int rows_per_set, bool norm_in, int64_t k, int stages) {
  const int64_t stage = rows_per_set == 2 ? StageBytes<2>() : StageBytes<1>();
  return kBarBytes + stages * stage + (norm_in ? 4 : 2) * k;
}

}  // namespace

int RingStages(int rows_per_set, bool norm_in, int64_t k, int smem_share) {
  // The kernel's static shared memory: partial (2 x 8 x R x 16 floats), StageRmsNorm's warp sums,
  // and 512 bytes of slack for what else ptxas places there (sm_90a: 1,024-2,176 bytes in all).
  const int64_t statics = 2 * kWarps * rows_per_set * kMmaRows * 4 + 512;
  const int64_t budget = std::min(kSmemPerCta, kSmemPerSm / smem_share - kReservedPerCta) - statics;
  int stages = 0;
  while (stages < kMaxStages && DynamicBytes(rows_per_set, norm_in, k, stages + 1) <= budget) {
    ++stages;
  }
  return stages >= kRefillLag + 1 ? stages : 0;
}

template <typename TOut, int R, Fold kFold>
absl::Status LaunchRing(const Args& p, TOut* out, cudaStream_t stream, bool pdl, int stages,
                        int ctas_per_sm) {
  int device = 0, sms = 0, optin = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{sms} * ctas_per_sm))),
      dim3(kWarps * 32), stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes =
      static_cast<size_t>(DynamicBytes(R, kFold == Fold::kNormIn, p.k, stages));
  const auto kernel = Fp8W16RingKernel<TOut, R, kFold>;
  // The whole 228 KiB as shared memory (two CTAs of ~110 KiB must fit an SM), and the opt-in at
  // its largest, not at this launch's size: one graph holds launches of one kernel with different
  // sizes (o_proj's and down_proj's AddTo), which must all stay within the attribute.
  cudaFuncAttributes attributes{};
  CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(std::min<int64_t>(kSmemPerCta, optin) -
                                            static_cast<int64_t>(attributes.sharedSizeBytes))));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, stages, out));
  return absl::OkStatus();
}

template absl::Status LaunchRing<bf16, 1, Fold::kNone>(const Args&, bf16*, cudaStream_t, bool, int,
                                                       int);
template absl::Status LaunchRing<float, 1, Fold::kNone>(const Args&, float*, cudaStream_t, bool,
                                                        int, int);
template absl::Status LaunchRing<bf16, 1, Fold::kNormIn>(const Args&, bf16*, cudaStream_t, bool,
                                                         int, int);
template absl::Status LaunchRing<bf16, 2, Fold::kNormIn>(const Args&, bf16*, cudaStream_t, bool,
                                                         int, int);
template absl::Status LaunchRing<bf16, 1, Fold::kAddOut>(const Args&, bf16*, cudaStream_t, bool,
                                                         int, int);

}  // namespace tandem::kernels::cuda::fp8_w16_internal
