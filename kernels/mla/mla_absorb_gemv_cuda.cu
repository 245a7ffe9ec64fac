// The decode-sized W_UK / W_UV absorption GEMVs (mla_cuda.h MlaAbsorbOptions): a one-token step
// streams kv_b_proj's W_UK (or W_UV) rows from HBM once (fp32 accumulation, one rounding to T;
// only the summation order differs from cuBLAS's GEMM). Longer steps run cuBLAS (a GEMV step of
// more tokens, forced through MlaAbsorbOptions, runs a CTA row per token, each reading the
// weights). Under PDL each CTA issues its first weight loads before griddepcontrol.wait: the
// weights never depend on the predecessor. Measured: kernels/mla/BENCHMARKS.md, "Twenty-ninth
// session" (a form computing 2-8 tokens from one weight read lost to cuBLAS from 2 tokens on at
// 128 heads and was removed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda::mla_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGemvNope = 256;  // qk_nope_head_dim the W_UK kernel stages (shared memory)

template <typename T>
__device__ __forceinline__ void Fma4(uint2 w, float x, float* acc) {
  const T* wt = reinterpret_cast<const T*>(&w);
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = fmaf(internal::ToFloat(wt[e]), x, acc[e]);
}

// q_cat[t, h, :L] = W_UK_h^T q_nope[t, h] and q_cat[t, h, L:] = q_pe[t, h], token t = blockIdx.z.
// W_UK_h is [Dn, L] row-major (kv_b_proj rows h * (Dn + Dv) ..), so the sum runs down its
// columns: thread (g, j) streams 4 columns (8 bytes; a warp's lanes cover 32 x 8 contiguous bytes
// of a row for kCols = 128, two rows' 128 for 64) of the rows d = g, g + G, .., 16 loads in
// flight, with q_nope staged once in shared memory as fp32; the G row groups' fp32 partials are
// summed in shared memory in group order. kCols = 64 where 128 would leave SMs idle (few heads).
// At most 64 registers (4 CTAs an SM): DeepSeek-V3's 512 CTAs are one wave (the earlier
// 8-column form took 80 registers, 3 CTAs an SM: two waves). Grid (ceil(L / kCols), Hq, T).
// Dynamic shared memory: (Dn + G * kCols) floats.
template <typename T, int kCols>
__global__ void __launch_bounds__(kThreads, 4)
    AbsorbQueryKernel(const T* __restrict__ q, const T* __restrict__ kv_b, int heads, int dn,
                      int dr, int dv, int lora, bool stream_weights, T* __restrict__ q_cat) {
  constexpr int C = kCols / 4, G = kThreads / C;
  constexpr int kUnroll = 16;  // 8-byte weight loads in flight a thread
  extern __shared__ float absorb_smem[];
  float* qs = absorb_smem;            // [dn]
  float* partial = absorb_smem + dn;  // [G][kCols]
  const int h = blockIdx.y, j = threadIdx.x % C, g = threadIdx.x / C;
  const int64_t th = static_cast<int64_t>(blockIdx.z) * heads + h;  // (token, head) row
  const int col = blockIdx.x * kCols + j * 4;
  const bool active = col < lora;  // lora % 8 == 0: a thread's 4 columns are all in or all out
  const T* w = kv_b + static_cast<int64_t>(h) * (dn + dv) * lora + col;
  uint2 wv[kUnroll];
  auto load = [&](int d0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int d = d0 + u * G;
      if (active && d < dn) {
        const uint2* p = reinterpret_cast<const uint2*>(w + static_cast<int64_t>(d) * lora);
        wv[u] = stream_weights ? __ldcs(p) : __ldg(p);
      }
    }
  };
  load(g);  // before the PDL wait: the weights are not the predecessor's output
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  const T* qn = q + th * (dn + dr);
  for (int d = threadIdx.x; d < dn; d += kThreads) qs[d] = internal::ToFloat(qn[d]);
  __syncthreads();
  float acc[4] = {};
  for (int d0 = g; d0 < dn; d0 += G * kUnroll) {
    if (d0 != g) load(d0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int d = d0 + u * G;
      if (active && d < dn) Fma4<T>(wv[u], qs[d], acc);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) partial[g * kCols + j * 4 + e] = acc[e];
  __syncthreads();
  T* out = q_cat + th * (lora + dr);
  for (int c = threadIdx.x; c < kCols; c += kThreads) {
    if (blockIdx.x * kCols + c >= lora) continue;
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < G; ++r) sum += partial[r * kCols + c];
    out[blockIdx.x * kCols + c] = internal::FromFloat<T>(sum);
  }
  if (blockIdx.x == 0) {  // q_pe into the last Dr columns (cuBLAS's path: a strided copy)
    for (int i = threadIdx.x; i < dr; i += kThreads) out[lora + i] = qn[dn + i];
  }
}

// out[t, h, v] = W_UV_h[v] . o_lat[t, h], token t = blockIdx.y: one warp per (head, kRows
// consecutive v) streams the rows' L-wide weights (kv_b_proj rows h * (Dn + Dv) + Dn + v ..) in
// 16-byte chunks, 2 chunks of each row a lane in flight with the o_lat chunks they share, and
// reduces over the warp. Grid (ceil(Hq * Dv / (8 x kRows)), T); Dv % kRows == 0. Measured
// (nvidia-h200-x2, ncu): 128 heads (16 MiB of W_UV) 13.1 us at 1 row a warp (2048 short CTAs),
// 7.1 at 4; 16 heads (2 MiB) 2.95 us at 1 row, 3.55 at 4 (64 CTAs on 132 SMs). So 4 rows a warp
// from kUvWideRows rows of a token on.
template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads)
    UnabsorbOutputKernel(const T* __restrict__ o_lat, const T* __restrict__ kv_b, int heads, int dn,
                         int dv, int lora, bool stream_weights, T* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * kRows;
  const bool active = row0 < static_cast<int64_t>(heads) * dv;
  const int64_t h = active ? row0 / dv : 0, v0 = row0 % dv;  // the rows share head h
  const int64_t th = static_cast<int64_t>(blockIdx.y) * heads + h;
  const uint4* w = reinterpret_cast<const uint4*>(kv_b + (h * (dn + dv) + dn + v0) * lora);
  const uint4* a = reinterpret_cast<const uint4*>(o_lat + th * lora);
  const int chunks = lora / 8;  // a row's 16-byte chunks; row r's start at w + r * chunks
  uint4 wv[kRows][2];
  auto load = [&](int c0) {
    const bool second = c0 + 32 < chunks;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint4* p = w + r * chunks + c0;
      wv[r][0] = stream_weights ? __ldcs(p) : __ldg(p);
      if (second) wv[r][1] = stream_weights ? __ldcs(p + 32) : __ldg(p + 32);
    }
  };
  if (active && lane < chunks) load(lane);  // before the PDL wait (weights only)
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!active) return;
  float acc[kRows] = {};
  for (int c0 = lane; c0 < chunks; c0 += 64) {
    const bool second = c0 + 32 < chunks;
    if (c0 != lane) load(c0);
    uint4 av[2];
    av[0] = __ldg(a + c0);
    if (second) av[1] = __ldg(a + c0 + 32);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k == 1 && !second) break;
      const T* at = reinterpret_cast<const T*>(&av[k]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const T* wt = reinterpret_cast<const T*>(&wv[r][k]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc[r] = fmaf(internal::ToFloat(wt[e]), internal::ToFloat(at[e]), acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if (lane < kRows) {
    float mine = acc[0];
#pragma unroll
    for (int r = 1; r < kRows; ++r) mine = lane == r ? acc[r] : mine;
    out[th * dv + v0 + lane] = internal::FromFloat<T>(mine);
  }
}

constexpr int64_t kUvWideRows = 8192;

template <typename T, int kCols>
absl::Status LaunchAbsorb(const T* q, const T* kv_b, const MlaDims& d, int64_t tokens, T* q_cat,
                          bool pdl, cudaStream_t stream) {
  constexpr int G = kThreads / (kCols / 4);
  const int64_t L = d.kv_lora_rank;
  const size_t smem = sizeof(float) * (d.qk_nope_head_dim + G * kCols);
  const dim3 grid(static_cast<unsigned>((L + kCols - 1) / kCols),
                  static_cast<unsigned>(d.num_heads), static_cast<unsigned>(tokens));
  const internal::PdlLaunchConfig config(grid, dim3(kThreads), stream, pdl, smem);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(
      config.get(), AbsorbQueryKernel<T, kCols>, q, kv_b, static_cast<int>(d.num_heads),
      static_cast<int>(d.qk_nope_head_dim), static_cast<int>(d.qk_rope_head_dim),
      static_cast<int>(d.v_head_dim), static_cast<int>(L), /*stream_weights=*/tokens == 1, q_cat));
  return absl::OkStatus();
}

template <typename T, int kRows>
absl::Status LaunchUnabsorb(const T* o_lat, const T* kv_b, const MlaDims& d, int64_t tokens, T* out,
                            bool pdl, cudaStream_t stream) {
  const int64_t rows_per_cta = kThreads / 32 * kRows, rows = d.num_heads * d.v_head_dim;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_cta - 1) / rows_per_cta),
                  static_cast<unsigned>(tokens));
  const internal::PdlLaunchConfig config(grid, dim3(kThreads), stream, pdl);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(
      config.get(), UnabsorbOutputKernel<T, kRows>, o_lat, kv_b, static_cast<int>(d.num_heads),
      static_cast<int>(d.qk_nope_head_dim), static_cast<int>(d.v_head_dim),
      static_cast<int>(d.kv_lora_rank), /*stream_weights=*/tokens == 1, out));
  return absl::OkStatus();
}

}  // namespace

bool AbsorbGemvApplies(const MlaDims& dims, int64_t num_tokens, int64_t max_tokens, const void* a,
                       const void* w) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return num_tokens <= max_tokens && dims.kv_lora_rank % 8 == 0 &&
         dims.qk_nope_head_dim <= kMaxGemvNope && aligned(a) && aligned(w);
}

template <typename T>
absl::Status AbsorbQueryGemv(const T* q, const T* kv_b, const MlaDims& dims, int64_t num_tokens,
                             T* q_cat, bool pdl, cudaStream_t stream) {
  // 128-column tiles unless they leave most of the GPU's ~132 SMs idle.
  const int64_t ctas = (dims.kv_lora_rank + 127) / 128 * dims.num_heads * num_tokens;
  return ctas < 128 ? LaunchAbsorb<T, 64>(q, kv_b, dims, num_tokens, q_cat, pdl, stream)
                    : LaunchAbsorb<T, 128>(q, kv_b, dims, num_tokens, q_cat, pdl, stream);
}

template <typename T>
absl::Status UnabsorbOutputGemv(const T* o_lat, const T* kv_b, const MlaDims& dims,
                                int64_t num_tokens, T* out, bool pdl, cudaStream_t stream) {
  if (dims.num_heads * dims.v_head_dim >= kUvWideRows && dims.v_head_dim % 4 == 0) {
    return LaunchUnabsorb<T, 4>(o_lat, kv_b, dims, num_tokens, out, pdl, stream);
  }
  return LaunchUnabsorb<T, 1>(o_lat, kv_b, dims, num_tokens, out, pdl, stream);
}

#define TANDEM_MLA_ABSORB_GEMV_INSTANTIATE(T)                                                     \
  template absl::Status AbsorbQueryGemv<T>(const T*, const T*, const MlaDims&, int64_t, T*, bool, \
                                           cudaStream_t);                                         \
  template absl::Status UnabsorbOutputGemv<T>(const T*, const T*, const MlaDims&, int64_t, T*,    \
                                              bool, cudaStream_t);
TANDEM_MLA_ABSORB_GEMV_INSTANTIATE(__nv_bfloat16)
TANDEM_MLA_ABSORB_GEMV_INSTANTIATE(__half)
#undef TANDEM_MLA_ABSORB_GEMV_INSTANTIATE

}  // namespace tandem::kernels::cuda::mla_internal
