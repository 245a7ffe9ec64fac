// The producers of FP8 activations with the quantization fused in
// (fp8_fused_quant_cuda.h). The arithmetic up to the bf16 output is kernels/layers/cuda's
// (layers_cuda.cu) line for line; the quantization is QuantizeActivations' (fp8_cuda.cu).
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"

namespace tandem::kernels::cuda {
namespace {

namespace cg = ::cooperative_groups;
using bf16 = __nv_bfloat16;
using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;
using internal::VecToFloat;

constexpr int kVec = 8;
constexpr int kThreads = 256;  // layers_cuda.cu's kNormThreads: the same BlockSum order
using V8 = float[kVec];
using BVec = Vec<bf16, kVec>;

// The block's max of one float per thread (exact in any order).
__device__ __forceinline__ float BlockMax(float v, float* warp_max) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
  return v;
}

// e4m3 codes of 8 values over `scale` (IEEE division, round to nearest even, saturating), as one
// 8-byte word.
__device__ __forceinline__ uint2 Codes8(const float (&v)[kVec], float scale) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const uint32_t code = __nv_cvt_float_to_fp8(v[e] / scale, __NV_SATFINITE, __NV_E4M3) & 0xFFu;
    w[e / 4] |= code << (8 * (e % 4));
  }
  return make_uint2(w[0], w[1]);
}

// The row's 1 x 128 groups from this thread's rounded outputs `held`: vector v of thread t holds
// columns (t + v * kThreads) * 8, so the 16 threads of a half-warp hold one group; its amax by
// shuffles within the half-warp (every lane shuffles, past-width vectors holding 0), its scale
// written by the group's first lane, codes 8 per 8-byte store.
template <int kVecs>
__device__ __forceinline__ void QuantizeHeldGroups(const float (&held)[kVecs][kVec], int64_t width,
                                                   int64_t row, uint8_t* codes, float* scales,
                                                   int64_t group_major_ld) {
  const int64_t groups = (width + 127) / 128;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t i = (threadIdx.x + int64_t{v} * kThreads) * kVec;
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(held[v][j]));
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    if (i >= width) continue;
    const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
    if (threadIdx.x % 16 == 0) {
      scales[Fp8GroupScaleIndex(row, i / 128, groups, group_major_ld)] = scale;
    }
    reinterpret_cast<uint2*>(codes + row * width)[i / kVec] = Codes8(held[v], scale);
  }
}

// The row's per-token scale from this thread's rounded outputs `held` (kVecs x 8, vectors at
// columns (threadIdx.x + v * kThreads) * 8 below width), then its codes, 8 per 8-byte store.
template <int kVecs>
__device__ __forceinline__ void QuantizeHeldRow(const float (&held)[kVecs][kVec], int64_t width,
                                                int64_t row, uint8_t* codes, float* scales) {
  __shared__ float warp_max[kThreads / 32];
  float amax = 0.0f;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(held[v][j]));
  }
  amax = BlockMax(amax, warp_max);
  const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  if (threadIdx.x == 0) scales[row] = scale;
  uint2* cr = reinterpret_cast<uint2*>(codes + row * width);
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t i = (threadIdx.x + int64_t{v} * kThreads) * kVec;
    if (i >= width) break;
    cr[i / kVec] = Codes8(held[v], scale);
  }
}

// layers_cuda.cu's RmsNormKernel (kVecs > 0), then the row quantized per token or (kGroups) per
// 1 x 128 group. held[] is zero for columns past hidden, which leaves the amax alone.
template <bool kFusedAdd, bool kGroups, int kVecs>
__global__ void __launch_bounds__(kThreads)
    RmsNormQuantKernel(const bf16* x, bf16* residual, const bf16* __restrict__ weight,
                       int64_t hidden, float eps, bf16* out, uint8_t* __restrict__ codes,
                       float* __restrict__ scales, int64_t group_major_ld) {
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  __shared__ float warp_sums[kThreads / 32];
  const int64_t row = blockIdx.x, base = row * hidden;
  const bf16* src = kFusedAdd ? residual : x;
  float held[kVecs][kVec] = {};
  float sum_sq = 0.0f;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t i = (threadIdx.x + int64_t{v} * kThreads) * kVec;
    if (i >= hidden) continue;
    float* a = held[v];
    VecToFloat(*reinterpret_cast<const BVec*>(src + base + i), a);
    if constexpr (kFusedAdd) {
      V8 b;
      VecToFloat(*reinterpret_cast<const BVec*>(x + base + i), b);
      BVec r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        r.v[j] = FromFloat<bf16>(a[j] + b[j]);
        a[j] = ToFloat(r.v[j]);
      }
      *reinterpret_cast<BVec*>(residual + base + i) = r;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq = fmaf(a[j], a[j], sum_sq);
  }
  const float inv_rms =
      rsqrtf(BlockSum<kThreads>(sum_sq, warp_sums) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t i = (threadIdx.x + int64_t{v} * kThreads) * kVec;
    if (i >= hidden) continue;
    V8 w;
    VecToFloat(*reinterpret_cast<const BVec*>(weight + i), w);
    BVec o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      o.v[j] = FromFloat<bf16>((held[v][j] * inv_rms) * w[j]);
      held[v][j] = ToFloat(o.v[j]);
    }
    *reinterpret_cast<BVec*>(out + base + i) = o;
  }
  if constexpr (kGroups) {
    QuantizeHeldGroups<kVecs>(held, hidden, row, codes, scales, group_major_ld);
  } else {
    QuantizeHeldRow<kVecs>(held, hidden, row, codes, scales);
  }
}

// layers_cuda.cu's SiluAndMulKernel per element, then the row quantized. One block alone per
// token was compute-bound on its SM (a decode step's m = 1: 8.0 us against 5.0 for the two
// kernels, H200), so a CLUSTER of kSiluCtas blocks shares each token: block r of the cluster
// takes vectors [r per, (r + 1) per), one 16-byte vector a thread, and the blocks' amax meet
// through distributed shared memory.
constexpr int kSiluCtas = 8;
static_assert(kFp8FusedQuantMaxWidth / kVec <= kSiluCtas * kThreads, "one vector a thread");

__global__ void __cluster_dims__(kSiluCtas, 1, 1) __launch_bounds__(kThreads)
    SiluAndMulQuantKernel(const bf16* __restrict__ gate_up, int64_t inter, bf16* __restrict__ out,
                          uint8_t* __restrict__ codes, float* __restrict__ scales) {
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  __shared__ float warp_max[kThreads / 32];
  __shared__ float block_amax;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / kSiluCtas;
  const int64_t vecs = inter / kVec, per = (vecs + kSiluCtas - 1) / kSiluCtas;
  const int64_t v = rank * per + threadIdx.x;
  const bool mine = threadIdx.x < per && v < vecs;
  const bf16* gr = gate_up + row * 2 * inter;
  float held[kVec] = {};
  if (mine) {
    V8 g, u;
    VecToFloat(*reinterpret_cast<const BVec*>(gr + v * kVec), g);
    VecToFloat(*reinterpret_cast<const BVec*>(gr + inter + v * kVec), u);
    BVec o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      o.v[j] = FromFloat<bf16>(g[j] / (1.0f + expf(-g[j])) * u[j]);
      held[j] = ToFloat(o.v[j]);
    }
    if (out != nullptr) *reinterpret_cast<BVec*>(out + row * inter + v * kVec) = o;
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(held[j]));
  amax = BlockMax(amax, warp_max);
  if (threadIdx.x == 0) block_amax = amax;
  cluster.sync();
  float row_amax = 0.0f;
#pragma unroll
  for (int r = 0; r < kSiluCtas; ++r) {
    row_amax = fmaxf(row_amax, *cluster.map_shared_rank(&block_amax, r));
  }
  const float scale = row_amax > 0.0f ? row_amax / kFp8E4m3Max : 1.0f;
  if (rank == 0 && threadIdx.x == 0) scales[row] = scale;
  if (mine) {
    reinterpret_cast<uint2*>(codes + row * inter)[v] = Codes8(held, scale);
  }
  cluster.sync();  // no block leaves while another still reads its block_amax
}

// The one place where the width becomes the per-thread vector count.
template <template <int> class K, typename... Args>
cudaError_t LaunchByWidth(int64_t m, int64_t width, cudaStream_t stream, bool pdl, Args... args) {
  const int64_t vecs = (width / kVec + kThreads - 1) / kThreads;
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(m)), dim3(kThreads), stream,
                                         pdl);
  if (vecs <= 1) return cudaLaunchKernelEx(config.get(), K<1>::kernel, args...);
  if (vecs <= 2) return cudaLaunchKernelEx(config.get(), K<2>::kernel, args...);
  if (vecs <= 4) return cudaLaunchKernelEx(config.get(), K<4>::kernel, args...);
  return cudaLaunchKernelEx(config.get(), K<8>::kernel, args...);
}

template <bool kAdd, bool kGroups>
struct Norm {
  template <int kVecs>
  struct Of {
    static constexpr auto kernel = RmsNormQuantKernel<kAdd, kGroups, kVecs>;
  };
};

template <bool kAdd, bool kGroups>
cudaError_t LaunchNorm(int64_t m, int64_t hidden, cudaStream_t stream, bool pdl, const bf16* x,
                       bf16* residual, const bf16* weight, float eps, bf16* out,
                       const Fp8TokenCodes& q) {
  return LaunchByWidth<Norm<kAdd, kGroups>::template Of>(
      m, hidden, stream, pdl, x, residual, weight, hidden, eps, out, q.codes, q.scales,
      q.group128 ? q.group_major_ld : int64_t{0});
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status Invalid(const char* op, int64_t m, int64_t width) {
  return absl::InvalidArgumentError(
      absl::StrCat("cuda::", op, ": needs m >= 0, a width that is a positive multiple of 8 up to ",
                   kFp8FusedQuantMaxWidth,
                   " and non-null 16-byte aligned buffers (SiluAndMulQuantFp8: per-token codes "
                   "only; group-major scales: group128 and an ld >= m); got m=",
                   m, " width=", width));
}

}  // namespace

bool Fp8FusedQuantSupported(int64_t width) {
  return width >= kVec && width % kVec == 0 && width <= kFp8FusedQuantMaxWidth;
}

absl::Status RmsNormQuantFp8(const bf16* x, bf16* residual, const bf16* weight, int64_t m,
                             int64_t hidden, float eps, bf16* out, const Fp8TokenCodes& q,
                             cudaStream_t stream, bool programmatic_launch) {
  const bool ok = m >= 0 && m <= 0x7fffffff && Fp8FusedQuantSupported(hidden) && Aligned(x) &&
                  Aligned(weight) && Aligned(out) && Aligned(q.codes) && x != nullptr &&
                  weight != nullptr && out != nullptr && q.codes != nullptr &&
                  q.scales != nullptr && Aligned(residual) &&
                  (q.group_major_ld == 0 || (q.group128 && q.group_major_ld >= m));
  if (!ok) return Invalid("RmsNormQuantFp8", m, hidden);
  if (m == 0) return absl::OkStatus();
  const bool pdl = programmatic_launch;
  const cudaError_t err =
      residual == nullptr
          ? (q.group128
                 ? LaunchNorm<false, true>(m, hidden, stream, pdl, x, residual, weight, eps, out, q)
                 : LaunchNorm<false, false>(m, hidden, stream, pdl, x, residual, weight, eps, out,
                                            q))
          : (q.group128
                 ? LaunchNorm<true, true>(m, hidden, stream, pdl, x, residual, weight, eps, out, q)
                 : LaunchNorm<true, false>(m, hidden, stream, pdl, x, residual, weight, eps, out,
                                           q));
  CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

absl::Status SiluAndMulQuantFp8(const bf16* gate_up, int64_t m, int64_t inter, bf16* out,
                                const Fp8TokenCodes& q, cudaStream_t stream,
                                bool programmatic_launch) {
  const bool ok = m >= 0 && m <= 0x7fffffff / kSiluCtas && Fp8FusedQuantSupported(inter) &&
                  gate_up != nullptr && Aligned(gate_up) && Aligned(out) && q.codes != nullptr &&
                  Aligned(q.codes) && q.scales != nullptr && !q.group128 && q.group_major_ld == 0;
  if (!ok) return Invalid("SiluAndMulQuantFp8", m, inter);
  if (m == 0) return absl::OkStatus();
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(m * kSiluCtas)), dim3(kThreads),
                                         stream, programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), SiluAndMulQuantKernel, gate_up, inter, out,
                                          q.codes, q.scales));
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
