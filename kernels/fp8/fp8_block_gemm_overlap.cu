// The overlapped forms of Fp8BlockGemmWgmma (fp8_block_gemm_cuda.h, Fp8BlockOverlap): the serial
// kernel's design (fp8_block_gemm_cuda.cu) with the promotion taken off the tensor cores' path.
//   * 384 threads: a producer warpgroup (its first warp as the serial kernel's producer, the
//     others idle; setmaxnreg 40) and two consumer warpgroups of 64 rows (setmaxnreg 232);
//   * a consumer's MMAs come in chunks of kCN columns (kBN / kCN chunks a k-group) into two
//     partial register sets in turn: chunk c + 1 is issued, then `wgmma.wait_group 1` (chunk c
//     done, c + 1 still running) and chunk c promoted, acc += part * a_scale * w_scale, on the
//     CUDA cores while the tensor cores work on c + 1; the stage is released after its last
//     chunk. k128: 128 x 128 tiles, one chunk a group (acc 64 + 2 x 64 partial registers);
//     k192: 128 x 192 tiles, two n96 chunks a group (96 + 2 x 48): 1.5x the FLOP per byte
//     loaded (a tile straddles two 128-row weight blocks: two weight scales a stage);
//     k192Serial: the same tiles, one m64n192 chunk a group waited for before its promotion
//     (acc 96 + 96 partial registers: the wider tile without the overlap).
// Scales staged by the producer as the serial kernel's kStaged; bf16 output from registers.
#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/fp8/fp8_block_gemm_overlap.h"

namespace tandem::kernels::cuda::fp8_block_overlap {
namespace device {  // named, not anonymous: see fp8_block_gemm_cuda.cu

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

inline constexpr int kBM = 128, kBK = 128;
inline constexpr int kThreads = 384;      // producer warpgroup + two consumer warpgroups
inline constexpr int kRasterM = 8;        // m-tiles of one raster group
inline constexpr int kScaleFloats = 144;  // a stage's 128 activation scales + 2 weight scales

template <int kBN>
struct Layout {
  static constexpr int kStageBytes = (kBM + kBN) * kBK;
  static constexpr int kBOff = kBM * kBK;
  static constexpr int kStages = kBN == 128 ? 6 : 5;
  static constexpr int kBarOff = kStages * kStageBytes;
  static constexpr int kScaleOff = kBarOff + 2 * kStages * 8;
  static constexpr int kSmemBytes = kScaleOff + kStages * kScaleFloats * 4 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
};

struct Params {
  CUtensorMap amap;  // A as [m][k] bytes, boxes of 128 x 128
  CUtensorMap wmap;  // the weight as [n][k] bytes, boxes of 128 columns x kBN rows
  const float* a_scales;
  const float* w_scales;
  const __nv_bfloat16* bias;
  __nv_bfloat16* out;
  int m, n, groups, w_ld, w_blocks, m_tiles, n_tiles;
};

// Tile u's origin: groups of kRasterM m-tiles, the group's n-tiles in order, m fastest.
template <int kBN>
__device__ __forceinline__ int2 TileAt(int u, const Params& p) {
  const int per_group = kRasterM * p.n_tiles;
  const int group = u / per_group, local = u - group * per_group;
  const int first = group * kRasterM;
  const int rows = min(kRasterM, p.m_tiles - first);
  return make_int2((first + local % rows) * kBM, (local / rows) * kBN);
}

// clang-format off
#define TANDEM_FP8O_R48 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define TANDEM_FP8O_R64 TANDEM_FP8O_R48 ", " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TANDEM_FP8O_R96 TANDEM_FP8O_R64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define TANDEM_FP8O_D4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define TANDEM_FP8O_D16(b) \
  TANDEM_FP8O_D4(b), TANDEM_FP8O_D4(b + 4), TANDEM_FP8O_D4(b + 8), TANDEM_FP8O_D4(b + 12)
// d (64 x kN fp32) = (scale_d ? d : 0) + A (64 x 32 e4m3) * B (32 x kN e4m3), both K-major in
// shared memory; d's layout as every m64nN wgmma (column 8 f + 2 (lane % 4) + {0, 1} of row
// warp * 16 + lane / 4 + 8 h in d[4 f + 2 h + {0, 1}]).
template <int kN>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], uint64_t da, uint64_t db, uint32_t acc) {
  if constexpr (kN == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" TANDEM_FP8O_R64 "}, "
        "%64, %65, p, 1, 1;\n}\n"
        : TANDEM_FP8O_D16(0), TANDEM_FP8O_D16(16), TANDEM_FP8O_D16(32), TANDEM_FP8O_D16(48)
        : "l"(da), "l"(db), "r"(acc));
  } else if constexpr (kN == 192) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {" TANDEM_FP8O_R96 "}, "
        "%96, %97, p, 1, 1;\n}\n"
        : TANDEM_FP8O_D16(0), TANDEM_FP8O_D16(16), TANDEM_FP8O_D16(32), TANDEM_FP8O_D16(48),
          TANDEM_FP8O_D16(64), TANDEM_FP8O_D16(80)
        : "l"(da), "l"(db), "r"(acc));
  } else {
    static_assert(kN == 96, "m64n96, m64n128 or m64n192");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {" TANDEM_FP8O_R48 "}, "
        "%48, %49, p, 1, 1;\n}\n"
        : TANDEM_FP8O_D16(0), TANDEM_FP8O_D16(16), TANDEM_FP8O_D16(32)
        : "l"(da), "l"(db), "r"(acc));
  }
}
#undef TANDEM_FP8O_D16
#undef TANDEM_FP8O_D4
#undef TANDEM_FP8O_R96
#undef TANDEM_FP8O_R64
#undef TANDEM_FP8O_R48
// clang-format on

__device__ __forceinline__ void CpAsync4(uint32_t dst, const float* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncArriveNoinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}

// The producer warp: per k-group of each tile, lane 0 the two TMA boxes; lane l the activation
// scales of rows l + 32 j (zeros past m), lanes 0 / 1 the scales of the weight blocks holding the
// tile's first / last row (clamped to the last block), by cp.async; all 32 lanes then arrive on
// the stage's barrier as their copies land.
template <int kBN>
__device__ void Produce(const Params& p, uint32_t ring, uint32_t scales, uint64_t* full,
                        uint64_t* empty) {
  using L = Layout<kBN>;
  const int lane = threadIdx.x & 31;
  int st = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < p.m_tiles * p.n_tiles; u += gridDim.x) {
    const int2 t = TileAt<kBN>(u, p);
    const int wb = min((t.y + (lane & 1) * (kBN - 1)) / 128, p.w_blocks - 1);
    const float* w_row = p.w_scales + static_cast<int64_t>(wb) * p.w_ld;
    for (int g = 0; g < p.groups; ++g) {
      MbarWait(empty + st, phase ^ 1);
      if (lane == 0) {
        const uint32_t stage = ring + st * L::kStageBytes;
        MbarArriveExpectTx(full + st, L::kStageBytes);  // boxes past the ends count in full
        TmaLoad2d(stage, &p.amap, g * kBK, t.x, full + st);
        TmaLoad2d(stage + L::kBOff, &p.wmap, g * kBK, t.y, full + st);
      }
      const uint32_t dst = scales + st * kScaleFloats * 4;
      const float* a = p.a_scales + static_cast<int64_t>(g) * p.m;
#pragma unroll
      for (int j = 0; j < kBM / 32; ++j) {
        const int r = t.x + lane + 32 * j;
        CpAsync4(dst + (lane + 32 * j) * 4, a + min(r, p.m - 1), r < p.m ? 4u : 0u);
      }
      if (lane < 2) CpAsync4(dst + (kBM + lane) * 4, w_row + g, 4u);
      CpAsyncArriveNoinc(full + st);
      if (++st == L::kStages) {
        st = 0;
        phase ^= 1;
      }
    }
  }
  CpAsyncCommit();  // nothing left in flight at exit
  CpAsyncWait<0>();
}

// A consumer warpgroup's ring position (stage, phase) on the issue side and the stage on the
// release side, the chunks of kBN / kCN a k-group.
template <int kBN, int kCN>
struct Consumer {
  using L = Layout<kBN>;
  static constexpr int kChunks = kBN / kCN;
  // k192Serial (kCN 192): one partial set, each group's MMAs waited for before its promotion
  // (the serial kernel's order on the wider tile; p1 unused).
  static constexpr bool kSerial = kCN == 192;
  float acc[kBN / 2];
  float p0[kCN / 2], p1[kCN / 2];
  uint32_t a_base, b_base;
  const float* scales;
  uint64_t *full, *empty;
  int ist = 0, rst = 0, lane, local;
  uint32_t iphase = 0;
  int boundary = kBN;  // the tile column where the second weight block starts

  // Issues chunk c of the tile (c % kChunks: its column offset) into part, first waiting for
  // the stage at a group's first chunk.
  template <int kHalf>
  __device__ __forceinline__ void Issue(float (&part)[kCN / 2]) {
    if (kHalf == 0) MbarWait(full + ist, iphase);
    const uint32_t so = ist * L::kStageBytes;
#pragma unroll
    for (int i = 0; i < kCN / 2; ++i) FenceOperand(part[i]);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) {
      Wgmma<kCN>(part, SmemDesc(a_base + so + kk * 32, 16, 1024),
                 SmemDesc(b_base + so + kHalf * kCN * kBK + kk * 32, 16, 1024), kk > 0 ? 1u : 0u);
    }
    WgmmaCommit();
    if (kHalf == kChunks - 1 && ++ist == L::kStages) {
      ist = 0;
      iphase ^= 1;
    }
  }

  // Promotes a finished chunk (its MMAs waited for) into acc; releases the stage after the
  // group's last chunk.
  template <int kHalf>
  __device__ __forceinline__ void Finish(float (&part)[kCN / 2]) {
#pragma unroll
    for (int i = 0; i < kCN / 2; ++i) FenceOperand(part[i]);
    const float* ss = scales + rst * kScaleFloats;
    const float a_lo = ss[local], a_hi = ss[local + 8], w0 = ss[kBM];
    const float w1 = kBN == 128 ? w0 : ss[kBM + 1];
    const float lo0 = a_lo * w0, hi0 = a_hi * w0, lo1 = a_lo * w1, hi1 = a_hi * w1;
    if (kHalf == kChunks - 1) {
      MbarArriveIf(empty + rst, lane == 0);  // the stage is free for the producer
      if (++rst == L::kStages) rst = 0;
    }
#pragma unroll
    for (int f = 0; f < kCN / 8; ++f) {
      const bool second = kBN != 128 && kHalf * kCN + 8 * f >= boundary;
      const float lo = second ? lo1 : lo0, hi = second ? hi1 : hi0;
      float* a = acc + kHalf * kCN / 2 + 4 * f;
      a[0] = fmaf(part[4 * f], lo, a[0]);
      a[1] = fmaf(part[4 * f + 1], lo, a[1]);
      a[2] = fmaf(part[4 * f + 2], hi, a[2]);
      a[3] = fmaf(part[4 * f + 3], hi, a[3]);
    }
  }

  // One tile's k-groups: chunk c + 1 issued before chunk c is waited for and promoted.
  __device__ __forceinline__ void Tile(int groups) {
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
    // Chunks in order: p0 takes the even ones, p1 the odd ones (k192: p0 a group's first n96
    // half, p1 its second; k128: alternate groups). One loop shape for both: ptxas kept the
    // MMAs in flight through this one, not through a loop with the tail's branch folded in.
    if constexpr (kSerial) {
      for (int g = 0; g < groups; ++g) {
        Issue<0>(p0);
        WgmmaWait<0>();
        Finish<0>(p0);
      }
      return;
    }
    constexpr int kOdd = kChunks - 1;
    const int total = groups * kChunks;
    Issue<0>(p0);
    int c = 0;
    for (; c + 2 < total; c += 2) {
      Issue<kOdd>(p1);
      WgmmaWait<1>();
      Finish<0>(p0);
      Issue<0>(p0);
      WgmmaWait<1>();
      Finish<kOdd>(p1);
    }
    if (c + 1 < total) {
      Issue<kOdd>(p1);
      WgmmaWait<1>();
      Finish<0>(p0);
      WgmmaWait<0>();
      Finish<kOdd>(p1);
    } else {
      WgmmaWait<0>();
      Finish<0>(p0);
    }
  }

  // The tile's bf16 output (rows row0, row0 + 8; the bias added in fp32 before the rounding).
  __device__ __forceinline__ void Store(const Params& p, int row0, int col0) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 8 * h;
      if (r >= p.m) continue;
      __nv_bfloat16* dst = p.out + static_cast<int64_t>(r) * p.n;
#pragma unroll
      for (int f = 0; f < kBN / 8; ++f) {
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
};

// A consumer warpgroup (wg 0 or 1 after the producer's): rows 64 wg .. 64 wg + 63 of each tile.
template <int kBN, int kCN>
__device__ void Consume(const Params& p, uint32_t ring, const float* scales, uint64_t* full,
                        uint64_t* empty) {
  const int wg = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3;
  Consumer<kBN, kCN> c;
  c.lane = threadIdx.x & 31;
  c.local = wg * 64 + warp * 16 + (c.lane >> 2);
  c.a_base = ring + wg * 64 * kBK;
  c.b_base = ring + Layout<kBN>::kBOff;
  c.scales = scales;
  c.full = full;
  c.empty = empty;
  for (int u = blockIdx.x; u < p.m_tiles * p.n_tiles; u += gridDim.x) {
    const int2 t = TileAt<kBN>(u, p);
    c.boundary = 128 - t.y % 128;
    c.Tile(p.groups);
    c.Store(p, t.x + c.local, t.y + (c.lane & 3) * 2);
  }
}

template <int kBN, int kCN>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8BlockOverlapKernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kBN>;
  extern __shared__ uint8_t smem_raw[];
  // wgmma's 128-byte swizzle is a function of address bits 7-9: 1024-byte aligned stages.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOff);
  uint64_t* empty = full + L::kStages;
  float* scales = reinterpret_cast<float*>(smem + L::kScaleOff);
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      MbarInit(full + s, 33);  // the expect-tx arrival (+ the TMA bytes) + 32 lanes' copies
      MbarInit(empty + s, 8);  // each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x < 32) Produce<kBN>(p, SmemAddr(smem), SmemAddr(scales), full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    Consume<kBN, kCN>(p, SmemAddr(smem), scales, full, empty);
  }
#endif
}

}  // namespace device

namespace {

template <int kBN, int kCN>
absl::Status SetSmem() {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(device::Fp8BlockOverlapKernel<kBN, kCN>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            device::Layout<kBN>::kSmemBytes));
  return absl::OkStatus();
}

absl::StatusOr<int> SmCount() {
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

template <int kBN, int kCN>
absl::Status LaunchTiles(device::Params p, const uint8_t* w_codes, int64_t n, int64_t k, int sms,
                         cudaStream_t stream) {
  ASSIGN_OR_RETURN(p.wmap, EncodeCodes(w_codes, n, k, kBN));
  p.n_tiles = static_cast<int>((n + kBN - 1) / kBN);
  const int grid = static_cast<int>(std::min<int64_t>(sms, int64_t{p.m_tiles} * p.n_tiles));
  device::Fp8BlockOverlapKernel<kBN, kCN>
      <<<grid, device::kThreads, device::Layout<kBN>::kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

}  // namespace tandem::kernels::cuda::fp8_block_overlap

namespace tandem::kernels::cuda {

int Fp8BlockOverlapAutoTileN(int64_t m, int64_t n, int sms) {
  const int64_t m_tiles = (m + 127) / 128;
  auto column_waves = [&](int64_t tile_n) {
    const int64_t tiles = m_tiles * ((n + tile_n - 1) / tile_n);
    return (tiles + sms - 1) / sms * tile_n;
  };
  // 1.5x the FLOP per byte loaded is worth up to 1/16 more column-waves (a guess, unmeasured).
  return column_waves(192) * 16 <= column_waves(128) * 17 ? 192 : 128;
}

}  // namespace tandem::kernels::cuda

namespace tandem::kernels::cuda::fp8_block_overlap {

absl::Status Init() {
  RETURN_IF_ERROR((SetSmem<128, 128>()));
  RETURN_IF_ERROR((SetSmem<192, 192>()));
  return SetSmem<192, 96>();
}

absl::Status Launch(Fp8BlockOverlap overlap, const uint8_t* a_codes, const float* a_scales,
                    const uint8_t* w_codes, const float* w_scales, int64_t m, int64_t n, int64_t k,
                    __nv_bfloat16* out, const __nv_bfloat16* bias, cudaStream_t stream) {
  ASSIGN_OR_RETURN(const int sms, SmCount());
  device::Params p{};
  ASSIGN_OR_RETURN(p.amap, EncodeCodes(a_codes, m, k, device::kBM));
  p.a_scales = a_scales;
  p.w_scales = w_scales;
  p.bias = bias;
  p.out = out;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.groups = static_cast<int>((k + device::kBK - 1) / device::kBK);
  p.w_ld = (p.groups + 3) / 4 * 4;  // Block128WeightScaleLd
  p.w_blocks = static_cast<int>((n + 127) / 128);
  p.m_tiles = static_cast<int>((m + device::kBM - 1) / device::kBM);
  if (overlap == Fp8BlockOverlap::k192Serial) {
    return LaunchTiles<192, 192>(p, w_codes, n, k, sms, stream);
  }
  const int tile_n = overlap == Fp8BlockOverlap::k128   ? 128
                     : overlap == Fp8BlockOverlap::k192 ? 192
                                                        : Fp8BlockOverlapAutoTileN(m, n, sms);
  return tile_n == 192 ? LaunchTiles<192, 96>(p, w_codes, n, k, sms, stream)
                       : LaunchTiles<128, 128>(p, w_codes, n, k, sms, stream);
}

}  // namespace tandem::kernels::cuda::fp8_block_overlap
