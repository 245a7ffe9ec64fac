#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"
#include "kernels/gemm/cuda/gemv_norm_stage.cuh"

namespace tandem::kernels::cuda {
namespace {

using namespace fp8_w16_internal;  // NOLINT(build/namespaces): this package's internal pieces

__device__ __forceinline__ float2 Half2BitsToFloat2(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// acc[r] += the 16 products of weight row r's chunk wv[r] (16 e4m3 codes) with the activations'
// 16 bf16 at column 16 c (shared memory under kShared, else through L1). A code becomes the f16
// with its sign, exponent and mantissa bits (exactly 2^-8 times its value: e4m3's bias 7 against
// f16's 15, subnormals onto subnormals), then fp32. Two accumulators a row (even / odd columns)
// halve the fmaf chain.
template <int R, bool kShared>
__device__ __forceinline__ void AddChunk(const uint4 (&wv)[R], const bf16* a, int64_t c,
                                         float (&acc)[R][2]) {
  const uint4* ap = reinterpret_cast<const uint4*>(a + c * 16);
  const uint4 a0 = kShared ? ap[0] : __ldg(ap), a1 = kShared ? ap[1] : __ldg(ap + 1);
  float af[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t x = Word(j < 4 ? a0 : a1, j & 3);
    af[2 * j] = __uint_as_float(x << 16);
    af[2 * j + 1] = __uint_as_float(x & 0xffff0000u);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = Word(wv[r], i);  // codes of columns 4 i .. 4 i + 3, low byte first
      const float2 even = Half2BitsToFloat2(((q << 8) & 0x80008000u) | ((q << 7) & 0x3F803F80u));
      const float2 odd = Half2BitsToFloat2((q & 0x80008000u) | ((q >> 1) & 0x3F803F80u));
      acc[r][0] = fmaf(even.x, af[4 * i], acc[r][0]);
      acc[r][1] = fmaf(odd.x, af[4 * i + 1], acc[r][1]);
      acc[r][0] = fmaf(even.y, af[4 * i + 2], acc[r][0]);
      acc[r][1] = fmaf(odd.y, af[4 * i + 3], acc[r][1]);
    }
  }
}

// The lane's next U chunks of each row, c, c + 32, ... (those below `chunks`).
template <int R, int U>
__device__ __forceinline__ void LoadBatch(const uint4* const (&wrow)[R], int64_t c, int64_t chunks,
                                          uint4 (&wv)[U][R]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c + 32 * u < chunks) wv[u][r] = __ldcs(wrow[r] + c + 32 * u);
    }
  }
}

// acc[r] = the warp's dot product of weight row r with a, times 2^-8. The lane owns chunks
// lane, lane + 32, ...; `buf` holds its first U (LoadBatch at c = lane). The loads stay in
// flight without a gap: the batch's two halves are used in turn, each reloaded with the chunks U
// further on as soon as it has been used, while the other half's loads are still arriving. The
// chunk order, hence every sum, is the same for any R (SiLU-and-mul's gate and up rows equal the
// plain kernel's) and any load schedule.
template <int R, int U, bool kShared>
__device__ __forceinline__ void WarpDot(const uint4* const (&wrow)[R], const bf16* a,
                                        int64_t chunks, int lane, uint4 (&buf)[U][R],
                                        float (&out)[R]) {
  static_assert(U % 2 == 0, "two halves");
  constexpr int H = U / 2;
  float acc[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32 * U) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const int u = half * H + h;
        if (c + 32 * u < chunks) AddChunk<R, kShared>(buf[u], a, c + 32 * u, acc);
      }
#pragma unroll
      for (int h = 0; h < H; ++h) {  // this half's next chunks, U further on
        const int u = half * H + h;
        const int64_t next = c + 32 * (U + u);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (next < chunks) buf[u][r] = __ldcs(wrow[r] + next);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r][0] + acc[r][1];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[r] = v;
  }
}

// WarpDot for grouped weights (scales per row and 128-column group): each chunk's products are
// summed apart, then multiplied by their group's scale (srow[r][c / 8], loaded beside the chunk's
// weight bytes) into the row's fp32 accumulators. The same load schedule and chunk order.
template <int R, int U, bool kShared>
__device__ __forceinline__ void WarpDotGrouped(const uint4* const (&wrow)[R],
                                               const float* const (&srow)[R], const bf16* a,
                                               int64_t chunks, int lane, uint4 (&buf)[U][R],
                                               float (&out)[R]) {
  static_assert(U % 2 == 0, "two halves");
  constexpr int H = U / 2;
  float sc[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (lane + 32 * u < chunks) sc[u][r] = __ldg(srow[r] + (lane + 32 * u) / kScaleGroupChunks);
    }
  }
  float acc[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32 * U) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const int u = half * H + h;
        if (c + 32 * u < chunks) {
          float part[R][2];
#pragma unroll
          for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = 0.0f;
          AddChunk<R, kShared>(buf[u], a, c + 32 * u, part);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            acc[r][0] = fmaf(part[r][0], sc[u][r], acc[r][0]);
            acc[r][1] = fmaf(part[r][1], sc[u][r], acc[r][1]);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < H; ++h) {  // this half's next chunks and scales, U further on
        const int u = half * H + h;
        const int64_t next = c + 32 * (U + u);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (next < chunks) {
            buf[u][r] = __ldcs(wrow[r] + next);
            sc[u][r] = __ldg(srow[r] + next / kScaleGroupChunks);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r][0] + acc[r][1];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[r] = v;
  }
}

// R = 1: warp = output row `row`. R = 2 (SiLU-and-mul, kNormIn): warp = output column `row`,
// streaming gate row `row` and up row n + `row` together (the activations read once for both).
// kGrouped: scales per row and 128-column group (WarpDotGrouped); false: per row.
template <typename TOut, int R, Fold kFold, bool kGrouped = false>
__global__ void __launch_bounds__(kWarps * 32) Fp8W16Kernel(Args p, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  constexpr int U = kLoads / R;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const bool active = row < p.n;
  const int64_t chunks = p.k / 16;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = reinterpret_cast<const uint4*>(p.w + (active ? row + r * p.n : 0) * p.k);
  }
  uint4 first[U][R];
  if (p.early && active) LoadBatch<R, U>(wrow, lane, chunks, first);
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early && active) LoadBatch<R, U>(wrow, lane, chunks, first);
  float dot[R];
  const float* srow[R];  // kGrouped: the rows' group scales
#pragma unroll
  for (int r = 0; r < R; ++r) srow[r] = p.scales + (row + r * p.n) * ScaleGroups(p.k);
  if constexpr (kFold == Fold::kNormIn) {
    extern __shared__ uint4 w16_smem[];  // the normalised row [k], then the norm weight [k]
    bf16* staged = reinterpret_cast<bf16*>(w16_smem);
    gemv_internal::StageRmsNorm<bf16, 1>(p.a, p.norm_weight, p.k, p.eps, staged,
                                         staged + p.k);  // every warp: barriers
    if (!active) return;
    if constexpr (kGrouped) {
      WarpDotGrouped<R, U, true>(wrow, srow, staged, chunks, lane, first, dot);
    } else {
      WarpDot<R, U, true>(wrow, staged, chunks, lane, first, dot);
    }
  } else {
    if (!active) return;
    if constexpr (kGrouped) {
      WarpDotGrouped<R, U, false>(wrow, srow, p.a, chunks, lane, first, dot);
    } else {
      WarpDot<R, U, false>(wrow, p.a, chunks, lane, first, dot);
    }
  }
  if (lane == 0) StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 256.0f, out);
}

// ---- Fp8W16Math::kTensorCore: the products on the tensor cores (mma.sync m16n8k16, f16 in,
// fp32 accumulate). A block owns 16 output rows (R = 2: 16 gate and the 16 matching up rows);
// its 8 warps split k: warp w takes the 64-column groups w, w + 8, ... of all 16 rows. In a group,
// lane (g = lane / 4, t = lane % 4) loads the 16 codes of columns 16 t .. 16 t + 15 of rows g and
// g + 8 (two 16-byte loads) and makes them exact f16 with the hardware convert (one
// F2FP.F16.E4M3.UNPACK_B per two codes on sm_90a): 4 A fragments. The k order inside a group is
// permuted (mma j takes columns 16 t + 4 j .. + 3 as its k = 2 t, 2 t + 1, 2 t + 8, 2 t + 9), the
// same permutation for the B fragment, which is the lane's own 16 activations (f16, staged in
// shared memory); all 8 columns of B are that vector, so C's column 0 holds the partial dots. A
// warp's partials meet in shared memory and warp 0 adds the 8 warps in a fixed order. SASS
// (sm_90a): 183 instructions in the loop's 4 groups a lane (128 weight bytes: 64 F2FP, 16 HMMA,
// 8 LDS, 8 LDG, the rest addressing and bounds), ~23 per 16 weight bytes (the fp32 form's ~80).
// kMmaRows, MmaGroup, MmaTilePartials, StageF16, StoreRow: fp8_w8a16_gemv_device.cuh (shared with
// the ring form and the RoPE fold, fp8_w8a16_rope_cuda.cu).

// kGrouped: scales per row and 128-column group (MmaTilePartials); false: per-row scales,
// applied once in StoreRow.
template <typename TOut, int R, Fold kFold, bool kGrouped = false>
__global__ void __launch_bounds__(kWarps * 32) Fp8W16MmaKernel(Args p, TOut* __restrict__ out) {
  TileKernelBody<TOut, R, kFold, kGrouped>(p, out, [&](const auto& row_of, auto& partial) {
    MmaTilePartials<R, kFold, kGrouped>(p, row_of, partial);
  });
}

// The kernel for `config` (its grid and shared memory set): kGrouped's instantiation for
// weights with scales per 128-column group, else the per-row one (the kernels as before).
template <typename TOut, int R, Fold kFold>
absl::Status LaunchKernel(bool mma, bool grouped, cudaLaunchConfig_t& config, const Args& p,
                          TOut* out) {
  if (grouped) {
    const auto kernel =
        mma ? Fp8W16MmaKernel<TOut, R, kFold, true> : Fp8W16Kernel<TOut, R, kFold, true>;
    RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
    CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, out));
    return absl::OkStatus();
  }
  if (!mma) {
    const auto kernel = Fp8W16Kernel<TOut, R, kFold>;
    RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
    CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, out));
    return absl::OkStatus();
  }
  const auto kernel = Fp8W16MmaKernel<TOut, R, kFold>;
  RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, out));
  return absl::OkStatus();
}

// Fp8W16Math::kAutoWaves' rule (the header): n output rows (of each set) in 16-row tiles against
// the SMs' resident CTAs, 2 an SM for kTensorCoreDeep, 4 for kTensorCore.
absl::StatusOr<bool> DeepFillsTheWavesBetter(int64_t n) {
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (n + kMmaRows - 1) / kMmaRows;
  return tiles <= int64_t{2} * sms || tiles > int64_t{4} * sms;
}

// grouped: the weight's scales per row and 128-column group (Fp8W16GroupedScales).
template <typename TOut, int R, Fold kFold>
absl::Status Launch(const char* name, bool supported, bool grouped, const Args& p, int64_t m,
                    TOut* out, cudaStream_t stream, bool pdl, Fp8W16Math math,
                    const Fp8W16SplitKWorkspace* split_k) {
  if (!supported || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": needs m = 1 (or up to ", kFp8W16TokensMaxM,
        " tokens whose staged activations fit ", kFp8W16TokensMaxSmemBytes,
        " bytes of shared memory), an e4m3 weight with scales constant along k (block_rows 1, "
        "block_cols >= k) or per 128 columns (block_rows 1, block_cols 128), k a positive "
        "multiple of 16 up to ",
        kFp8W16MaxK,
        ", 16-byte aligned codes and activations, a non-null out (and with the norm folded in, a "
        "16-byte aligned norm weight and 4 k bytes <= ",
        kFp8W16NormInMaxSmemBytes, " of shared memory); got m=", m, " n=", p.n, " k=", p.k));
  }
  if (m > 1) return LaunchTokens<TOut, R, kFold>(p, m, out, stream, pdl, grouped);
  const bool ring =
      math == Fp8W16Math::kRing || math == Fp8W16Math::kRing2 || math == Fp8W16Math::kRingHalf;
  if (ring && grouped) {
    math = Fp8W16Math::kTensorCore;  // no grouped ring form: the tensor-core kernel's
  } else if (ring) {
    const int stages =
        RingStages(R, kFold == Fold::kNormIn, p.k, math == Fp8W16Math::kRing ? 1 : 2);
    if (stages > 0) {
      return LaunchRing<TOut, R, kFold>(p, out, stream, pdl, stages,
                                        math == Fp8W16Math::kRing2 ? 2 : 1);
    }
    math = Fp8W16Math::kTensorCore;  // the ring does not fit: the same bits from registers
  }
  if (math == Fp8W16Math::kAutoWaves && !grouped) {
    math = Fp8W16Math::kTensorCoreWide;  // the header: faster on every 8B / 70B projection
  } else if (math == Fp8W16Math::kAutoWaves) {
    math = Fp8W16Math::kAuto;
    if (kFold == Fold::kNormIn || p.k * 2 <= kFp8W16AutoMaxStagingBytes) {  // kAuto's mma
      ASSIGN_OR_RETURN(const bool deep, DeepFillsTheWavesBetter(p.n));
      if (deep) math = Fp8W16Math::kTensorCoreDeep;
    }
  }
  if (math == Fp8W16Math::kTensorCoreDeep) {
    return LaunchDeep<TOut, R, kFold>(p, out, stream, pdl, grouped);
  }
  if (math == Fp8W16Math::kTensorCorePersistent) {
    return LaunchPersistent<TOut, R, kFold>(p, out, stream, pdl, grouped);
  }
  if (math == Fp8W16Math::kTensorCoreWide) {
    return LaunchWide<TOut, R, kFold>(p, out, stream, pdl, grouped);
  }
  if (math == Fp8W16Math::kTensorCoreSplitK) {
    if (split_k != nullptr) {
      ASSIGN_OR_RETURN(const bool launched,
                       (LaunchSplitK<TOut, R, kFold>(p, out, stream, pdl, grouped, *split_k)));
      if (launched) return absl::OkStatus();
    }
    math = Fp8W16Math::kTensorCore;  // one split, or no workspace: the whole-k tiles
  }
  const bool mma = math == Fp8W16Math::kTensorCore ||
                   (math == Fp8W16Math::kAuto &&
                    (kFold == Fold::kNormIn || p.k * 2 <= kFp8W16AutoMaxStagingBytes));
  const int64_t rows_per_block = mma ? kMmaRows : kWarps;
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>((p.n + rows_per_block - 1) / rows_per_block)), dim3(kWarps * 32),
      stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  if (kFold == Fold::kNormIn) {
    config.dynamicSmemBytes = static_cast<size_t>(2 * p.k * sizeof(bf16));
  } else if (mma) {
    config.dynamicSmemBytes = static_cast<size_t>(p.k * sizeof(bf16));  // the f16 activations
  }
  return LaunchKernel<TOut, R, kFold>(mma, grouped, config, p, out);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Args MakeArgs(const bf16* a, const Fp8DeviceWeight& w, const bf16* bias, int64_t rows, bool early) {
  return Args{a, w.codes, w.scales, bias, rows, w.grid.cols, nullptr, 0.0f, early};
}

}  // namespace

bool Fp8W16GroupedScales(const Fp8ScaleGrid& g) {
  return g.block_rows == 1 && g.block_cols == kFp8W16ScaleGroupCols && g.cols > g.block_cols;
}

bool Fp8W16GemvSupported(const void* a, const Fp8DeviceWeight& w, int64_t m) {
  const Fp8ScaleGrid& g = w.grid;
  // The multi-token form: its staging and the two-round sums' 2 KiB of static memory.
  const bool tokens_fit = m >= 2 && m <= kFp8W16TokensMaxM &&
                          TokensSmemBytes(m, g.cols, false) + 2048 <= kFp8W16TokensMaxSmemBytes;
  return (m == 1 || tokens_fit) && a != nullptr && w.codes != nullptr && w.scales != nullptr &&
         Aligned16(a) && Aligned16(w.codes) && g.rows >= 1 && g.cols >= 16 && g.cols % 16 == 0 &&
         g.cols <= kFp8W16MaxK && g.block_rows == 1 &&
         (g.block_cols >= g.cols || Fp8W16GroupedScales(g)) &&
         g.rows <= (int64_t{1} << 31) * kWarps;
}

bool Fp8W16GemvNormInSupported(const void* x, const void* norm_weight, const Fp8DeviceWeight& w,
                               int64_t m) {
  // m > 1: the staged rows, the norm weight, SiLU-and-mul's 4 KiB of sums and the norm's.
  const int64_t smem =
      m == 1 ? 2 * w.grid.cols * 2 + gemv_internal::kStageRmsNormStaticSmemBytes
             : TokensSmemBytes(m, w.grid.cols, true) + 4096 + kTokenNormStaticSmemBytes;
  return Fp8W16GemvSupported(x, w, m) && norm_weight != nullptr && Aligned16(norm_weight) &&
         smem <= (m == 1 ? kFp8W16NormInMaxSmemBytes : kFp8W16TokensMaxSmemBytes);
}

bool Fp8W16TokensTwoCtasPerSm(int64_t m, int64_t k, bool norm_in, int rows_per_set) {
  return m >= 2 && m <= kFp8W16TokensMaxM && TokensCtasPerSm(m, k, norm_in, rows_per_set) == 2;
}

template <typename TOut>
absl::Status Fp8W16Gemv(const bf16* a, const Fp8DeviceWeight& w, const bf16* bias, int64_t m,
                        TOut* out, cudaStream_t stream, bool programmatic_launch,
                        bool early_weight_loads, Fp8W16Math math,
                        const Fp8W16SplitKWorkspace* split_k) {
  return Launch<TOut, 1, Fold::kNone>("Fp8W16Gemv", Fp8W16GemvSupported(a, w, m),
                                      Fp8W16GroupedScales(w.grid),
                                      MakeArgs(a, w, bias, w.grid.rows, early_weight_loads), m, out,
                                      stream, programmatic_launch, math, split_k);
}

absl::Status Fp8W16GemvNormIn(const bf16* x, const bf16* norm_weight, float eps,
                              const Fp8DeviceWeight& w, const bf16* bias, int64_t m, bf16* out,
                              cudaStream_t stream, bool programmatic_launch,
                              bool early_weight_loads, Fp8W16Math math,
                              const Fp8W16SplitKWorkspace* split_k) {
  Args p = MakeArgs(x, w, bias, w.grid.rows, early_weight_loads);
  p.norm_weight = norm_weight;
  p.eps = eps;
  return Launch<bf16, 1, Fold::kNormIn>(
      "Fp8W16GemvNormIn", Fp8W16GemvNormInSupported(x, norm_weight, w, m),
      Fp8W16GroupedScales(w.grid), p, m, out, stream, programmatic_launch, math, split_k);
}

absl::Status Fp8W16GemvNormInSiluMul(const bf16* x, const bf16* norm_weight, float eps,
                                     const Fp8DeviceWeight& w, const bf16* bias, int64_t m,
                                     bf16* out, cudaStream_t stream, bool programmatic_launch,
                                     bool early_weight_loads, Fp8W16Math math,
                                     const Fp8W16SplitKWorkspace* split_k) {
  Args p = MakeArgs(x, w, bias, w.grid.rows / 2, early_weight_loads);
  p.norm_weight = norm_weight;
  p.eps = eps;
  return Launch<bf16, 2, Fold::kNormIn>(
      "Fp8W16GemvNormInSiluMul",
      w.grid.rows % 2 == 0 && Fp8W16GemvNormInSupported(x, norm_weight, w, m),
      Fp8W16GroupedScales(w.grid), p, m, out, stream, programmatic_launch, math, split_k);
}

absl::Status Fp8W16GemvAddTo(const bf16* a, const Fp8DeviceWeight& w, const bf16* bias, int64_t m,
                             bf16* residual, cudaStream_t stream, bool programmatic_launch,
                             bool early_weight_loads, Fp8W16Math math,
                             const Fp8W16SplitKWorkspace* split_k) {
  return Launch<bf16, 1, Fold::kAddOut>("Fp8W16GemvAddTo", Fp8W16GemvSupported(a, w, m),
                                        Fp8W16GroupedScales(w.grid),
                                        MakeArgs(a, w, bias, w.grid.rows, early_weight_loads), m,
                                        residual, stream, programmatic_launch, math, split_k);
}

template absl::Status Fp8W16Gemv<bf16>(const bf16*, const Fp8DeviceWeight&, const bf16*, int64_t,
                                       bf16*, cudaStream_t, bool, bool, Fp8W16Math,
                                       const Fp8W16SplitKWorkspace*);
template absl::Status Fp8W16Gemv<float>(const bf16*, const Fp8DeviceWeight&, const bf16*, int64_t,
                                        float*, cudaStream_t, bool, bool, Fp8W16Math,
                                        const Fp8W16SplitKWorkspace*);

}  // namespace tandem::kernels::cuda
