// Fp8BlockGemmWgmma (fp8_block_gemm_cuda.h): the block-scaled FP8 GEMM on wgmma + TMA.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/fp8/fp8_block_gemm_cuda.h"
#include "kernels/fp8/fp8_block_gemm_overlap.h"

namespace tandem::kernels::cuda {
// A named namespace, not an anonymous one: the compute_90 PTX pass compiles no kernel body
// (wgmma is sm_90a only), and nvcc would reject the then-unused helpers as unreferenced.
namespace fp8_block_wgmma_internal {

using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::MbarArriveExpectTx;
using internal::SmemAddr;
using internal::TmaLoad2d;
using internal::prefill::FenceOperand;
using internal::prefill::MbarArriveIf;
using internal::prefill::MbarInit;
using internal::prefill::MbarWait;
using internal::prefill::SmemDesc;
using internal::prefill::WgmmaCommit;
using internal::prefill::WgmmaFence;
using internal::prefill::WgmmaWait;

inline constexpr int kBM = 128, kBN = 128;
inline constexpr int kBK = 128;  // one scale group; one 128-byte swizzled row per tile row
inline constexpr int kStages = 6;
inline constexpr int kBOff = kBM * kBK;  // the weight tile inside a stage
inline constexpr int kStageBytes = (kBM + kBN) * kBK;
inline constexpr int kBarOff = kStages * kStageBytes;
// kStaged: each stage's scales beside the ring: the tile's 128 activation scales, then the
// weight block's (144 floats: 16-byte aligned stages).
inline constexpr int kScaleOff = kBarOff + 2 * kStages * 8;
inline constexpr int kScaleFloats = 144;
// Ring + full / empty barriers + scales + slack for the 1024-byte alignment of the tiles.
inline constexpr int kSmemBytes = kScaleOff + kStages * kScaleFloats * 4 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
inline constexpr int kConsumerThreads = 256;            // two warpgroups of 64 rows
inline constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
inline constexpr int kRasterM = 8;                      // m-tiles of one raster group
using ScaleLoad = Fp8BlockScaleLoad;

struct Params {
  CUtensorMap amap;  // A as [m][k] bytes, boxes of 128 x 128
  CUtensorMap wmap;  // the weight as [n][k] bytes, boxes of 128 x 128
  const float* a_scales;
  const float* w_scales;
  const __nv_bfloat16* bias;
  __nv_bfloat16* out;
  int m, n, k, groups, w_ld, m_tiles, n_tiles;
};

// Where a tile is: clusters of kCluster CTAs (cluster rank r) take units of kCluster adjacent
// m-tiles sharing one n-tile, in groups of kRasterM m-tiles (the units' n-tiles in order inside a
// group, its m-units fastest). m0_load: the A rows loaded, the last m-tile's for a rank past it
// (the tile of a cluster's second CTA where m-tiles are odd: computed, never stored).
struct TileRef {
  int m0, m0_load, n0;
};
template <int kCluster>
__device__ __forceinline__ int MUnits(const Params& p) {
  return (p.m_tiles + kCluster - 1) / kCluster;
}
template <int kCluster>
__device__ __forceinline__ TileRef TileAt(int u, int rank, const Params& p) {
  constexpr int kGroup = kRasterM / kCluster;
  const int per_group = kGroup * p.n_tiles;
  const int group = u / per_group, local = u - group * per_group;
  const int first = group * kGroup;
  const int units = min(kGroup, MUnits<kCluster>(p) - first);
  const int m0 = ((first + local % units) * kCluster + rank) * kBM;
  return {m0, min(m0, (p.m_tiles - 1) * kBM), (local / units) * kBN};
}

// This CTA's units: every stride-th from first (kCluster 1: one CTA a unit).
template <int kCluster>
struct UnitWalk {
  int first, stride, rank;
};
template <int kCluster>
__device__ __forceinline__ UnitWalk<kCluster> MyUnits() {
  if constexpr (kCluster == 1) {
    return {static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), 0};
  } else {
    uint32_t id, count, rank;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(id));
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(count));
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return {static_cast<int>(id), static_cast<int>(count), static_cast<int>(rank)};
  }
}

// Every thread of the cluster (release / acquire: the barrier inits before, remote arrivals
// before the exit).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// An arrival on the barrier at bar's offset in CTA `cta` of the cluster, when pred holds
// (predicated inside the asm, as MbarArriveIf).
__device__ __forceinline__ void MbarArriveCluster(uint64_t* bar, uint32_t cta, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 remote;\nsetp.ne.u32 p, %2, 0;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(
          SmemAddr(bar)),
      "r"(cta), "r"(static_cast<uint32_t>(pred))
      : "memory");
}

// TMA multicast: the box into shared memory at offset dst of every CTA of the cluster in
// cta_mask, completing its bytes on the barrier at bar's offset in each.
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int col,
                                                   int row, uint64_t* bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(SmemAddr(bar)), "h"(cta_mask)
      : "memory");
}

// clang-format off
#define TANDEM_FP8_WG_REGS64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TANDEM_FP8_WG_D4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define TANDEM_FP8_WG_D16(b) \
  TANDEM_FP8_WG_D4(b), TANDEM_FP8_WG_D4(b + 4), TANDEM_FP8_WG_D4(b + 8), TANDEM_FP8_WG_D4(b + 12)
// d (64 x 128, fp32) = (scale_d ? d : 0) + A (64 x 32 e4m3, K-major smem) * B (32 x 128 e4m3,
// K-major smem). Accumulator layout as every m64n128 wgmma: row warp * 16 + lane / 4 + 8 h,
// column 8 f + 2 (lane % 4) + {0, 1} in d[4 f + 2 h + {0, 1}].
__device__ __forceinline__ void WgmmaE4m3(float* d, uint64_t desc_a, uint64_t desc_b,
                                          uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" TANDEM_FP8_WG_REGS64 "}, "
      "%64, %65, p, 1, 1;\n}\n"
      : TANDEM_FP8_WG_D16(0), TANDEM_FP8_WG_D16(16), TANDEM_FP8_WG_D16(32),
        TANDEM_FP8_WG_D16(48)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#undef TANDEM_FP8_WG_D16
#undef TANDEM_FP8_WG_D4
#undef TANDEM_FP8_WG_REGS64
// clang-format on

// 4-byte cp.async (zero-filled where src_bytes is 0; src is then not read).
__device__ __forceinline__ void CpAsync4(uint32_t dst, const float* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// An arrival on `bar` once every cp.async this thread issued before has landed; counts as one
// of the barrier's expected arrivals (.noinc).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}

// The producer warp: every k-group of every tile of this CTA into the ring, lane 0 the two TMA
// boxes (kCluster 2: the A tile, and half of the weight tile's rows multicast into both CTAs, so
// each stage's barrier still counts the whole stage's bytes); kStaged: lane l also the activation
// scales of tile rows l, l + 32, l + 64, l + 96 (zeros past m) and lane 0 the weight block's, by
// cp.async, all 32 lanes then arriving on the stage's barrier as their copies land.
template <ScaleLoad kScales, int kCluster>
__device__ void Produce(const Params& p, uint32_t ring, uint32_t scales, uint64_t* full,
                        uint64_t* empty) {
  const int lane = threadIdx.x & 31;
  if (kScales == ScaleLoad::kDirect && lane != 0) return;
  const UnitWalk<kCluster> walk = MyUnits<kCluster>();
  // kCluster 2: this CTA's half of the weight rows (the first half again past n: those output
  // columns are never stored).
  constexpr int kHalf = kBN / kCluster;
  uint32_t step = 0;
  for (int u = walk.first; u < MUnits<kCluster>(p) * p.n_tiles; u += walk.stride) {
    const TileRef tr = TileAt<kCluster>(u, walk.rank, p);
    const float* w_row = p.w_scales + static_cast<int64_t>(tr.n0 / 128) * p.w_ld;
    const int w_row0 = tr.n0 + walk.rank * kHalf < p.n ? tr.n0 + walk.rank * kHalf : tr.n0;
    for (int g = 0; g < p.groups; ++g, ++step) {
      const int st = step % kStages;
      MbarWait(empty + st, ((step / kStages) & 1) ^ 1);
      if (lane == 0) {
        const uint32_t stage = ring + st * kStageBytes;
        MbarArriveExpectTx(full + st, kStageBytes);  // boxes past the ends count in full
        TmaLoad2d(stage, &p.amap, g * kBK, tr.m0_load, full + st);
        if constexpr (kCluster == 1) {
          TmaLoad2d(stage + kBOff, &p.wmap, g * kBK, tr.n0, full + st);
        } else {
          TmaLoad2dMulticast(stage + kBOff + walk.rank * kHalf * kBK, &p.wmap, g * kBK, w_row0,
                             full + st, static_cast<uint16_t>((1u << kCluster) - 1));
        }
      }
      if constexpr (kScales == ScaleLoad::kStaged) {
        const uint32_t dst = scales + st * kScaleFloats * 4;
        const float* a = p.a_scales + static_cast<int64_t>(g) * p.m;
#pragma unroll
        for (int j = 0; j < kBM / 32; ++j) {
          const int r = tr.m0 + lane + 32 * j;
          CpAsync4(dst + (lane + 32 * j) * 4, a + min(r, p.m - 1), r < p.m ? 4u : 0u);
        }
        if (lane == 0) CpAsync4(dst + kBM * 4, w_row + g, 4u);
        CpAsyncArriveNoinc(full + st);
      }
    }
  }
  if constexpr (kScales == ScaleLoad::kStaged) {  // nothing left in flight at exit
    CpAsyncCommit();
    CpAsyncWait<0>();
  }
}

// The thread's two rows' scales of group g times the tile's weight-block scale.
struct GroupScales {
  float lo, hi;
};
// kDirect: from global memory (rows clamped to m - 1: rows past m are computed from TMA's zeros
// and never stored).
__device__ __forceinline__ GroupScales LoadScales(const Params& p, int g, int row_lo, int row_hi,
                                                  const float* w_row) {
  const float* a = p.a_scales + static_cast<int64_t>(g) * p.m;
  const float w = __ldg(w_row + g);
  return {__ldg(a + row_lo) * w, __ldg(a + row_hi) * w};
}

// One k-group of a consumer warpgroup: four m64n128k32 MMAs into part (fresh), wait, release
// the stage (lane 0 of each warp; kCluster 2: lane r on CTA r's barrier, the stage's weight rows
// having come from both), then the promotion acc += part * scale of the row.
template <int kCluster>
__device__ __forceinline__ void GroupMma(float (&acc)[64], float (&part)[64], uint32_t a_addr,
                                         uint32_t b_addr, uint64_t* empty_bar, int lane,
                                         GroupScales s) {
#pragma unroll
  for (int i = 0; i < 64; ++i) FenceOperand(part[i]);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kBK / 32; ++kk) {
    WgmmaE4m3(part, SmemDesc(a_addr + kk * 32, 16, 1024), SmemDesc(b_addr + kk * 32, 16, 1024),
              kk > 0 ? 1u : 0u);
  }
  WgmmaCommit();
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) FenceOperand(part[i]);
  if constexpr (kCluster == 1) {
    MbarArriveIf(empty_bar, lane == 0);  // the stage is free for the producer
  } else {
    MbarArriveCluster(empty_bar, lane % kCluster, lane < kCluster);
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = fmaf(part[i], (i & 2) ? s.hi : s.lo, acc[i]);
}

// The tile's bf16 output from a warpgroup's accumulators (rows from row0, row0 + 8; the bias
// added in fp32 before the one rounding).
__device__ __forceinline__ void StoreTile(const Params& p, const float (&acc)[64], int row0,
                                          int col0) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r >= p.m) continue;
    __nv_bfloat16* dst = p.out + static_cast<int64_t>(r) * p.n;
#pragma unroll
    for (int f = 0; f < 16; ++f) {
      const int c = col0 + 8 * f;
      if (c >= p.n) continue;
      float x = acc[4 * f + 2 * h], y = acc[4 * f + 2 * h + 1];
      if (p.bias != nullptr) {
        x += __bfloat162float(p.bias[c]);
        y += __bfloat162float(p.bias[c + 1]);
      }
      *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(x, y);
    }
  }
}

// A consumer warpgroup (wg 0 or 1): rows 64 wg .. 64 wg + 63 of every tile.
template <ScaleLoad kScales, int kCluster>
__device__ void Consume(const Params& p, uint32_t ring, const float* scales, uint64_t* full,
                        uint64_t* empty) {
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int local = wg * 64 + warp * 16 + (lane >> 2);  // the thread's first row in the tile
  const uint32_t a_base = ring + wg * 64 * kBK, b_base = ring + kBOff;
  uint32_t step = 0;
  float acc[64], part[64];
  const UnitWalk<kCluster> walk = MyUnits<kCluster>();
  for (int u = walk.first; u < MUnits<kCluster>(p) * p.n_tiles; u += walk.stride) {
    const TileRef tr = TileAt<kCluster>(u, walk.rank, p);
    const int row0 = tr.m0 + local;
    const int row_lo = min(row0, p.m - 1), row_hi = min(row0 + 8, p.m - 1);
    const float* w_row = p.w_scales + static_cast<int64_t>(tr.n0 / 128) * p.w_ld;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    GroupScales s{};
    if constexpr (kScales == ScaleLoad::kDirect) s = LoadScales(p, 0, row_lo, row_hi, w_row);
    for (int g = 0; g < p.groups; ++g, ++step) {
      const int st = step % kStages;
      GroupScales next{};
      if constexpr (kScales == ScaleLoad::kDirect) {  // in flight during this group's MMAs
        next = LoadScales(p, min(g + 1, p.groups - 1), row_lo, row_hi, w_row);
      }
      MbarWait(full + st, (step / kStages) & 1);
      if constexpr (kScales == ScaleLoad::kStaged) {  // landed with the stage
        const float* ss = scales + st * kScaleFloats;
        s = {ss[local] * ss[kBM], ss[local + 8] * ss[kBM]};
      }
      const uint32_t so = st * kStageBytes;
      GroupMma<kCluster>(acc, part, a_base + so, b_base + so, empty + st, lane, s);
      if constexpr (kScales == ScaleLoad::kDirect) s = next;
    }
    StoreTile(p, acc, row0, tr.n0 + (lane & 3) * 2);
  }
}

template <ScaleLoad kScales, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8BlockGemmKernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // wgmma's 128-byte swizzle is a function of address bits 7-9: 1024-byte aligned stages.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);
  uint64_t* empty = full + kStages;
  float* scales = reinterpret_cast<float*>(smem + kScaleOff);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // The producer's expect-tx arrival (+ the TMA bytes); kStaged: + its 32 lanes' copies.
      MbarInit(full + s, kScales == ScaleLoad::kStaged ? 33 : 1);
      MbarInit(empty + s, 8 * kCluster);  // each consumer warp of each CTA that reads it
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    ClusterSync();  // the peer's barriers are initialized before anything lands on them
  } else {
    __syncthreads();
  }
  if (threadIdx.x >= kConsumerThreads) {
    Produce<kScales, kCluster>(p, SmemAddr(smem), SmemAddr(scales), full, empty);
  } else {
    Consume<kScales, kCluster>(p, SmemAddr(smem), scales, full, empty);
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (kCluster > 1) ClusterSync();
#endif
}

}  // namespace fp8_block_wgmma_internal

namespace {

using fp8_block_wgmma_internal::Fp8BlockGemmKernel;
using fp8_block_wgmma_internal::kBK;
using fp8_block_wgmma_internal::kBM;
using fp8_block_wgmma_internal::kBN;
using fp8_block_wgmma_internal::kSmemBytes;
using fp8_block_wgmma_internal::kThreads;
using fp8_block_wgmma_internal::Params;

absl::StatusOr<bool> IsSm90() {
  int dev = 0, major = 0, minor = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The kernels built: (staged, 1), (direct, 1), (staged, 2).
template <typename Fn>
absl::Status ForEachKernel(Fn fn) {
  RETURN_IF_ERROR(fn(Fp8BlockGemmKernel<Fp8BlockScaleLoad::kStaged, 1>));
  RETURN_IF_ERROR(fn(Fp8BlockGemmKernel<Fp8BlockScaleLoad::kDirect, 1>));
  return fn(Fp8BlockGemmKernel<Fp8BlockScaleLoad::kStaged, 2>);
}

// One CTA per SM over the tiles.
template <Fp8BlockScaleLoad kScales>
absl::Status LaunchPlain(const Params& p, cudaStream_t stream) {
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int grid = static_cast<int>(std::min<int64_t>(sms, int64_t{p.m_tiles} * p.n_tiles));
  Fp8BlockGemmKernel<kScales, 1><<<grid, kThreads, kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Clusters of 2 CTAs, as many as fit at once on the device, over the units of 2 m-tiles.
absl::Status LaunchMulticast(const Params& p, cudaStream_t stream) {
  const auto kernel = Fp8BlockGemmKernel<Fp8BlockScaleLoad::kStaged, 2>;
  const int64_t units = int64_t{(p.m_tiles + 1) / 2} * p.n_tiles;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(units, 1024)));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  if (clusters < 1) {
    return absl::InternalError("Fp8BlockGemmWgmma: no cluster of 2 CTAs fits on this device");
  }
  cfg.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(units, clusters)));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, p));
  return absl::OkStatus();
}

}  // namespace

namespace fp8_block_overlap {

absl::StatusOr<CUtensorMap> EncodeCodes(const uint8_t* base, int64_t rows, int64_t k,
                                        int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = internal::TensorMapEncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap map{};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("Fp8BlockGemmWgmma: cuTensorMapEncodeTiled failed: ", static_cast<int>(r)));
  }
  return map;
}

}  // namespace fp8_block_overlap

bool Fp8BlockGemmWgmmaSupported() {
  const absl::StatusOr<bool> sm90 = IsSm90();
  return sm90.ok() && *sm90;
}

absl::Status Fp8BlockGemmWgmmaInit() {
  ASSIGN_OR_RETURN(const bool sm90, IsSm90());
  if (!sm90) return absl::OkStatus();
  RETURN_IF_ERROR(ForEachKernel([](auto kernel) -> absl::Status {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return absl::OkStatus();
  }));
  return fp8_block_overlap::Init();
}

absl::Status Fp8BlockGemmWgmma(const uint8_t* a_codes, const float* a_scales,
                               const uint8_t* w_codes, const float* w_scales, int64_t m, int64_t n,
                               int64_t k, __nv_bfloat16* out, const __nv_bfloat16* bias,
                               cudaStream_t stream, Fp8BlockWgmmaForm form) {
  if (m < 0 || n < 0 || n % 2 != 0 || k < 16 || k % 16 != 0 || m > 0x7fffff80 || n > 0x7fffff80 ||
      k > 0x7fffff80 || a_codes == nullptr || w_codes == nullptr || a_scales == nullptr ||
      w_scales == nullptr || out == nullptr || !Aligned16(a_codes) || !Aligned16(w_codes) ||
      reinterpret_cast<uintptr_t>(out) % 4 != 0 ||
      (form.multicast && form.scales != Fp8BlockScaleLoad::kStaged) ||
      (form.overlap != Fp8BlockOverlap::kNone &&
       (form.multicast || form.scales != Fp8BlockScaleLoad::kStaged))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8BlockGemmWgmma: needs m >= 0, n >= 0 even, k a positive multiple of 16, 16-byte "
        "aligned codes, non-null scales, a 4-byte aligned out (multicast: staged scales; overlap: "
        "staged scales, no multicast); got m=",
        m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool sm90, IsSm90());
  if (!sm90) {
    return absl::FailedPreconditionError("Fp8BlockGemmWgmma: needs an sm_90 (Hopper) device");
  }
  // The shared-memory opt-in is a host call: made here unless capturing (Fp8BlockGemmWgmmaInit
  // made it before capture then).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) RETURN_IF_ERROR(Fp8BlockGemmWgmmaInit());
  if (form.overlap != Fp8BlockOverlap::kNone) {
    return fp8_block_overlap::Launch(form.overlap, a_codes, a_scales, w_codes, w_scales, m, n, k,
                                     out, bias, stream);
  }
  Params p{};
  ASSIGN_OR_RETURN(p.amap, fp8_block_overlap::EncodeCodes(a_codes, m, k, kBM));
  ASSIGN_OR_RETURN(p.wmap,
                   fp8_block_overlap::EncodeCodes(w_codes, n, k, form.multicast ? kBN / 2 : kBN));
  p.a_scales = a_scales;
  p.w_scales = w_scales;
  p.bias = bias;
  p.out = out;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.groups = static_cast<int>((k + kBK - 1) / kBK);
  p.w_ld = (p.groups + 3) / 4 * 4;  // Block128WeightScaleLd
  p.m_tiles = static_cast<int>((m + kBM - 1) / kBM);
  p.n_tiles = static_cast<int>((n + kBN - 1) / kBN);
  if (form.multicast) return LaunchMulticast(p, stream);
  return form.scales == Fp8BlockScaleLoad::kDirect
             ? LaunchPlain<Fp8BlockScaleLoad::kDirect>(p, stream)
             : LaunchPlain<Fp8BlockScaleLoad::kStaged>(p, stream);
}

}  // namespace tandem::kernels::cuda
