// The weight-only FP8 GEMV at 2-8 tokens (fp8_w8a16_gemv_cuda.h, "Several tokens"): the deep
// tensor-core kernel's tiles, loads and mma (fp8_w8a16_deep_cuda.cu) with the m16n8k16 B operand's
// 8 columns holding 8 tokens instead of one token 8 times, so one read of each weight byte serves
// every token of the step.
//
// B's column n comes from the lanes with g = lane / 4 = n: lane (g, t) reads token g's staged f16
// activations of its own chunk (tokens past m: token m - 1's, their columns never stored). C's
// elements of lane (g, t) are tokens 2 t and 2 t + 1 of rows g and g + 8. The activations of all m
// tokens are staged once a CTA (copied by cp.async, every copy in flight at once, then made f16
// in place: [m][k], the two 16-byte halves of each chunk swapped in odd tokens' rows so that the
// lanes g and g + 1 of a quarter warp read different banks; NormIn: the m rows' RMSNorms with
// one shared barrier, each bit-identical to RmsNorm<bf16>), the CTAs
// persistent (min(tiles, resident CTAs)), each walking tiles b, b + gridDim.x, ... with the next
// tile's first loads issued as soon as the products of the last are done. The warps' sums meet in
// two rounds (warps 4-7 write, warps 0-3 add: half the shared memory of one slot a warp, which
// lets Llama-3-8B's down_proj stage 8 tokens x 14,336 columns in one CTA's 227 KiB), then thread
// 16 i + j stores token i's row j of the tile (StoreRow). Deterministic; not the one-token forms'
// bits (another sum order across warps).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {
namespace {

constexpr int kTokenLoads = 2 * kLoads;  // the deep kernel's loads in flight a lane
constexpr int kMaxTokens = static_cast<int>(kFp8W16TokensMaxM);
constexpr int kSumSlots = kWarps / 2;  // the two-round sum's slots

// dst[i] = src[i] for i < count 16-byte units, global to shared through cp.async: every copy in
// flight at once and no registers held (the staging of 8 tokens x 14,336 columns is 229 KiB a
// CTA). Barrier after.
__device__ __forceinline__ void CopyToShared(const uint4* src, int count, uint4* dst) {
  for (int i = threadIdx.x; i < count; i += kWarps * 32) {
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + i));
  }
  asm volatile("cp.async.commit_group;\ncp.async.wait_all;\n" ::: "memory");
  __syncthreads();
}

// The staged bf16 rows act16 [m][k / 8] made f16 in place, chunk by chunk (two uint4), each
// chunk's halves swapped in odd tokens' rows (k / 8 is even: a chunk never straddles rows);
// kNorm: each value first normalised as RmsNorm<bf16> does, (x * inv_rms[token]) * w rounded to
// bf16, w the norm weight staged at act16 + m k / 8. Barrier after.
template <bool kNorm>
__device__ __forceinline__ void ConvertTokensF16(int m, int64_t k, const float* inv_rms,
                                                 uint4* act16) {
  const int row = static_cast<int>(k / 8), chunks = m * row / 2;
  const uint4* norm_w = act16 + m * row;
  for (int i = threadIdx.x; i < chunks; i += kWarps * 32) {
    const int token = (2 * i) / row, odd = token & 1;
    uint4 x[2] = {act16[2 * i], act16[2 * i + 1]};
    if constexpr (kNorm) {
      const int c = 2 * i - token * row;  // the chunk's first uint4 in its row
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float f[8], wf[8];
        internal::VecToFloat(*reinterpret_cast<const internal::Vec<bf16, 8>*>(&x[h]), f);
        internal::VecToFloat(*reinterpret_cast<const internal::Vec<bf16, 8>*>(norm_w + c + h), wf);
        internal::Vec<bf16, 8> v;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v.v[j] = internal::FromFloat<bf16>((f[j] * inv_rms[token]) * wf[j]);
        x[h] = *reinterpret_cast<const uint4*>(&v);
      }
    }
    act16[2 * i + odd] = Bf16x8ToF16(x[0]);
    act16[2 * i + 1 - odd] = Bf16x8ToF16(x[1]);
  }
  __syncthreads();
}

// inv_rms[r] (shared, r < m) = RmsNorm<bf16>'s 1 / rms of staged bf16 row r of act16 [m][k]:
// StageRmsNorm's (gemv_norm_stage.cuh) per-thread fmaf order and BlockSum's butterfly and warp
// order, the m rows' reductions sharing one barrier. Barrier after.
__device__ __forceinline__ void TokenInvRms(int m, int64_t k, float eps, const uint4* act16,
                                            float (&warp_sums)[kMaxTokens][kWarps],
                                            float (&inv_rms)[kMaxTokens]) {
  const bf16* x = reinterpret_cast<const bf16*>(act16);
  float sum_sq[kMaxTokens];
#pragma unroll
  for (int r = 0; r < kMaxTokens; ++r) sum_sq[r] = 0.0f;
  for (int64_t i = threadIdx.x * 8; i < k; i += kWarps * 32 * 8) {
#pragma unroll
    for (int r = 0; r < kMaxTokens; ++r) {
      if (r < m) {
        float f[8];
        internal::VecToFloat(*reinterpret_cast<const internal::Vec<bf16, 8>*>(x + r * k + i), f);
#pragma unroll
        for (int j = 0; j < 8; ++j) sum_sq[r] = fmaf(f[j], f[j], sum_sq[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxTokens; ++r) {
    float v = sum_sq[r];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) warp_sums[r][threadIdx.x / 32] = v;
  }
  __syncthreads();
  if (threadIdx.x < m) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += warp_sums[threadIdx.x][w];
    inv_rms[threadIdx.x] = rsqrtf(v / static_cast<float>(k) + eps);
  }
  __syncthreads();
}

// The activations of the m tokens into act16 as ConvertTokensF16 lays them out: a's rows copied
// (kNormIn: and the norm weight after them, each row's RmsNorm bit-identical to RmsNorm<bf16>),
// then made f16 in place.
template <Fold kFold>
__device__ __forceinline__ void StageTokens(const Args& p, int m, uint4* act16) {
  const int row = static_cast<int>(p.k / 8);
  CopyToShared(reinterpret_cast<const uint4*>(p.a), m * row, act16);
  if constexpr (kFold == Fold::kNormIn) {
    __shared__ float warp_sums[kMaxTokens][kWarps];
    __shared__ float inv_rms[kMaxTokens];
    CopyToShared(reinterpret_cast<const uint4*>(p.norm_weight), row, act16 + m * row);
    TokenInvRms(m, p.k, p.eps, act16, warp_sums, inv_rms);
    ConvertTokensF16<true>(m, p.k, inv_rms, act16);
  } else {
    ConvertTokensF16<false>(m, p.k, nullptr, act16);
  }
}

// The lane's C elements (tokens 2 t, 2 t + 1 of rows g, g + 8) into slot s of sums (add: onto
// what the slot holds); tokens >= m skipped.
template <int R>
__device__ __forceinline__ void PutTokenSums(const float (&acc)[R][4], int s, int lane, int m,
                                             bool add,
                                             float (&sums)[kSumSlots][R][kMaxTokens][kMmaRows]) {
  const int g = lane / 4, t0 = 2 * (lane % 4);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = t0 + (e & 1), row = g + 8 * (e >> 1);
      if (token < m) {
        float& slot = sums[s][r][token][row];
        slot = add ? slot + acc[r][e] : acc[r][e];
      }
    }
  }
}

template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelTokens(Args p, int m, TOut* __restrict__ out) {
  static_assert(R == 1 || (R == 2 && kFold == Fold::kNormIn && std::is_same_v<TOut, bf16>));
  static_assert(kFold != Fold::kAddOut || std::is_same_v<TOut, bf16>);
  constexpr int G = kTokenLoads / (2 * R);
  __shared__ float sums[kSumSlots][R][kMaxTokens][kMmaRows];
  extern __shared__ uint4 w16_smem[];  // f16 activations [m][k] (kNormIn: then the norm weight)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = static_cast<int>(p.k / 16), c0 = warp * 4 + lane % 4;
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const uint4* wrow[R][2];
  const float* srow[R][2];  // kGrouped
  uint4 buf[G][R][2];
  float sc[kGrouped ? G : 1][R][2];
  int64_t tile = blockIdx.x;
  PersistentStart<R, kGrouped, G>(p, lane, c0, chunks, wrow, srow, buf, sc);
  StageTokens<kFold>(p, m, w16_smem);      // once a CTA (barrier after)
  const int token = min(lane / 4, m - 1);  // the B column this lane supplies
  const uint4* act = w16_smem + token * (p.k / 8);
  for (; tile < tiles;) {
    float acc[R][4];
    MmaTileGroups<R, kGrouped, G, true>(wrow, srow, act, warp, c0, chunks, buf, sc, acc, token & 1);
    const int64_t next = tile + gridDim.x;
    if (next < tiles) {  // the next tile's first groups in flight across the sums and stores
      PersistentTileRows<R>(p, next, lane, wrow, srow);
      LoadFirstGroups<R, kGrouped, G>(wrow, srow, c0, chunks, buf, sc);
    }
    __syncthreads();  // the last tile's stores have read sums
    if (warp >= kSumSlots) PutTokenSums<R>(acc, warp - kSumSlots, lane, m, false, sums);
    __syncthreads();
    if (warp < kSumSlots) PutTokenSums<R>(acc, warp, lane, m, true, sums);
    __syncthreads();
    const int i = threadIdx.x / kMmaRows, j = threadIdx.x % kMmaRows;
    const int64_t row = tile * kMmaRows + j;
    if (i < m && row < p.n) {
      float dot[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        dot[r] = 0.0f;
#pragma unroll
        for (int s = 0; s < kSumSlots; ++s) dot[r] += sums[s][r][i][j];
      }
      StoreRow<TOut, R, kFold, !kGrouped>(p, row, dot, 1.0f, out + i * p.n);
    }
    tile = next;
  }
}

}  // namespace

int64_t TokensSmemBytes(int64_t m, int64_t k, bool norm_in) {
  return (m + (norm_in ? 1 : 0)) * k * 2;
}

int TokensCtasPerSm(int64_t m, int64_t k, bool norm_in, int rows_per_set) {
  // Each CTA: its staging, its static sums (and norms), 1 KiB the hardware reserves; an SM 228 KiB.
  const int64_t per_cta =
      TokensSmemBytes(m, k, norm_in) +
      int64_t{sizeof(float)} * kSumSlots * rows_per_set * kMaxTokens * kMmaRows +
      kTokenNormStaticSmemBytes + 1024;
  return 2 * per_cta <= int64_t{228} * 1024 ? 2 : 1;
}

template <typename TOut, int R, Fold kFold>
absl::Status LaunchTokens(const Args& p, int64_t m, TOut* out, cudaStream_t stream, bool pdl,
                          bool grouped) {
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  const int64_t dynamic = TokensSmemBytes(m, p.k, kFold == Fold::kNormIn);
  const int ctas_per_sm = TokensCtasPerSm(m, p.k, kFold == Fold::kNormIn, R);
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{ctas_per_sm} * sms))),
      dim3(kWarps * 32), stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>(dynamic);
  const auto kernel = grouped ? Fp8W16MmaKernelTokens<TOut, R, kFold, true>
                              : Fp8W16MmaKernelTokens<TOut, R, kFold, false>;
  RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, static_cast<int>(m), out));
  return absl::OkStatus();
}

#define TANDEM_W16_TOKEN_FORMS(TOut, R, kFold)                                                  \
  template absl::Status LaunchTokens<TOut, R, kFold>(const Args&, int64_t, TOut*, cudaStream_t, \
                                                     bool, bool);
TANDEM_W16_TILE_FORMS(TANDEM_W16_TOKEN_FORMS)
#undef TANDEM_W16_TOKEN_FORMS

}  // namespace tandem::kernels::cuda::fp8_w16_internal
