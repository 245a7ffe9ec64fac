// The Hopper (sm_90a) latent attention kernel for an FP8 latent pool (mla_fp8_latent.h: e4m3
// codes, one fp32 scale per row) behind MlaLatentAttention (mla_cuda.h), latent 512 + 64, q and
// o_lat in bf16 / fp16: mla_decode_wgmma.cu's kernel with the latents read as codes (half the
// bytes of a bf16 pool) and dequantized in shared memory.
//
// Same CTA, rows, math and output as the bf16 kernel: 64 (query token x head) rows of one request
// x one split of its context, two warpgroups, scores and P V by wgmma on T tiles. Shared memory
// (226 KiB, one CTA per SM): Q (72 KiB of T, swizzled), ONE latent tile of T (72 KiB, swizzled:
// what the wgmma read) and a 2-stage cp.async ring of raw tiles (64 rows x 576 codes, 36 KiB, and
// the rows' 64 scales). Per tile t:
//   * every thread waits for its copies of raw tile t; CTA barrier (tile t - 1's T tile, P and
//     raw stage are free); raw tile t + 1 is issued into the other stage (four threads per row,
//     the block table read per latent: any page size);
//   * all 256 threads dequantize raw tile t into the T tile: 8 codes per 16-byte unit, e4m3 pairs
//     to fp16 (cvt.rn.f16x2.e4m3x2, exact), to fp32 times the row's scale, rounded once to T (as a
//     bf16 pool rounds the latent once); the generic-proxy writes fenced for wgmma; CTA barrier;
//   * warpgroup 0: S = Q K^T, the online softmax, P to shared memory, O[:, 0:256] += P V;
//     warpgroup 1: O[:, 256:512] += P V (mla_wgmma.cuh, as in the bf16 kernels).
// The dequantization is not overlapped with the tensor-core work of the same CTA (two T tiles do
// not fit next to Q and the raw ring): BENCHMARKS.md measures what that costs. Rows past the
// split's end are zero-filled (codes and scale 0) and masked by the softmax.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_status.h"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace: the compute_90 pass compiles the kernel body away, and nvcc would
// then flag every helper of internal linkage as unused.
namespace fp8_kernel {

using internal::prefill::FenceProxyAsync;
using wgmma_common::BarArrive;
using wgmma_common::BarSync;
using wgmma_common::CopyTileRow;
using wgmma_common::LoadP;
using wgmma_common::PackTwo;
using wgmma_common::RescaleAndAddPv;
using wgmma_common::Scores;
using wgmma_common::ShareWg0RowSums;
using wgmma_common::Softmax;
using wgmma_common::StoreP;
using wgmma_common::StoreWgRows;

inline constexpr int kD = wgmma_common::kTileDim, kRows = 64, kKeys = 64;
inline constexpr int kTileBytes = wgmma_common::kTileBytes;  // Q, or the T tile: 72 KiB
inline constexpr int kRawBytes = kKeys * kD;                 // one raw stage's codes: 36 KiB
inline constexpr int kKOff = kTileBytes;                     // the T tile
inline constexpr int kRawOff = 2 * kTileBytes;               // raw stages: [2][64 rows][576] codes
inline constexpr int kScaleOff = kRawOff + 2 * kRawBytes;    // their row scales: [2][64] fp32
inline constexpr int kPOff = kScaleOff + 2 * kKeys * 4;      // P: [4 k16 steps][128 threads] uint4
inline constexpr int kFOff = kPOff + 4 * 128 * 16;         // rescale factors: [128 threads] float2
inline constexpr int kSmemBytes = kFOff + 128 * 8 + 1024;  // + slack for the 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");

// 4-byte global -> shared copy (a row scale); zero-fills the destination when !pred.
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(pred ? 4 : 0));
}

// This thread's 16-byte units (part, part + 4, ...) of latent `key`'s codes into row `row` of a
// raw stage, and (part 0) its scale; !ok zero-fills both (nothing read).
template <typename T>
__device__ __forceinline__ void CopyRawRow(const LatentParams<T>& p, const int32_t* table, int key,
                                           bool ok, uint8_t* raw, float* scales, int row,
                                           int part) {
  const uint8_t* src = p.pool8;
  const float* scale = p.row_scales;
  if (ok) {
    const int64_t block = table[key / p.block_size];
    const int64_t in = p.layer_offset + static_cast<int64_t>(key % p.block_size) * kD;
    src += block * p.code_block_stride + in;
    scale += block * p.scale_block_stride + in / kD;
  }
  uint8_t* dst = raw + row * kD;
#pragma unroll
  for (int i = 0; i < kD / 16 / 4; ++i) {
    const int u = part + 4 * i;
    CpAsync16(dst + u * 16, src + u * 16, ok);
  }
  if (part == 0) CpAsync4(scales + row, scale, ok);
}

// Two e4m3 codes (low byte first) times the row scale, as a pair of T.
template <typename T>
__device__ __forceinline__ uint32_t DequantTwo(uint32_t codes, float scale) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return PackTwo<T>(f.x * scale, f.y * scale);
}

// Raw stage (codes + scales) -> the swizzled T tile, all 256 threads: unit idx = row * 72 + u of
// 8 codes at raw + 8 idx, to (u / 8) * kChunkBytes + row * 128 + ((u % 8) ^ (row % 8)) * 16.
template <typename T>
__device__ __forceinline__ void Dequantize(const uint8_t* raw, const float* scales, uint8_t* tile,
                                           int tid) {
  constexpr int kUnits = kD / 8;
#pragma unroll 6
  for (int idx = tid; idx < kKeys * kUnits; idx += kMlaWgmmaThreads) {
    const int r = idx / kUnits, u = idx % kUnits;
    const uint2 c = *reinterpret_cast<const uint2*>(raw + idx * 8);
    const float s = scales[r];
    const uint4 v = make_uint4(DequantTwo<T>(c.x & 0xffffu, s), DequantTwo<T>(c.x >> 16, s),
                               DequantTwo<T>(c.y & 0xffffu, s), DequantTwo<T>(c.y >> 16, s));
    *reinterpret_cast<uint4*>(tile + (u / 8) * wgmma_common::kChunkBytes + r * 128 +
                              ((u % 8) ^ (r % 8)) * 16) = v;
  }
}

template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaThreads, 1)
    MlaFp8Kernel(const __grid_constant__ LatentParams<T> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // wgmma's swizzle is a function of address bits 7-9: tiles must be 1024-byte aligned.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint4* sp = reinterpret_cast<uint4*>(smem + kPOff);
  float2* sf = reinterpret_cast<float2*>(smem + kFOff);
  float* scales = reinterpret_cast<float*>(smem + kScaleOff);

  const LatentCta c = LatentCtaOf(p, kRows);
  if (c.r0 >= c.rows_seq || EmptySplitDone(p, c, kRows)) return;
  const int split = blockIdx.x, q0 = c.q0, rows_seq = c.rows_seq, r0 = c.r0, kb = c.kb, ke = c.ke;
  const int32_t* table = c.table;
  const int num_tiles = c.Tiles(kKeys);
  const int tid = threadIdx.x, wg = tid / 128, wt = tid % 128;
  const int lane = tid % 32, t4 = lane % 4;
  const int row_lo = (wt / 32) * 16 + lane / 4, row_hi = row_lo + 8;

  // Q (zero rows beyond the request's) joins the first raw tile's copy group.
  const int crow = tid / 4, cpart = tid % 4;
  {
    const bool ok = r0 + crow < rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(q0) * p.heads + r0 + crow) * kD : p.q;
    CopyTileRow(smem, crow, cpart, src, ok);
  }
  auto load_raw = [&](int t) {
    const int key = kb + t * kKeys + crow;
    CopyRawRow(p, table, key, key < ke, smem + kRawOff + (t % 2) * kRawBytes,
               scales + (t % 2) * kKeys, crow, cpart);
  };
  if (num_tiles > 0) load_raw(0);
  CpAsyncCommit();

  const int vis[2] = {c.KeyEnd(p, row_lo), c.KeyEnd(p, row_hi)};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint32_t q_addr = SmemAddr(smem), k_addr = q_addr + kKOff;

  for (int t = 0; t < num_tiles; ++t) {
    CpAsyncWait<0>();
    __syncthreads();  // raw tile t landed everywhere; the T tile, P and the other stage are free
    if (t + 1 < num_tiles) load_raw(t + 1);
    CpAsyncCommit();
    Dequantize<T>(smem + kRawOff + (t % 2) * kRawBytes, scales + (t % 2) * kKeys, smem + kKOff,
                  tid);
    FenceProxyAsync();  // the tile's generic writes (and Q's copies), before wgmma reads them
    __syncthreads();
    uint32_t pa[4][4];
    float alpha[2];
    if (wg == 0) {
      float sc[32];
      Scores<T>(sc, q_addr, k_addr);
      Softmax<T>(sc, kb + t * kKeys, t4, vis, p.scale_log2, m_run, l_run, alpha, pa);
      StoreP(sp, wt, pa);
      sf[wt] = make_float2(alpha[0], alpha[1]);
      BarArrive(1, kMlaWgmmaThreads);
    } else {
      BarSync(1, kMlaWgmmaThreads);
      const float2 f = sf[wt];
      alpha[0] = f.x;
      alpha[1] = f.y;
      LoadP(sp, wt, pa);
    }
    RescaleAndAddPv<T>(o, pa, alpha, k_addr, wg);  // O[:, 256 wg .. + 256) = alpha O + P V
  }
  CpAsyncWait<0>();

  // Row sums: warpgroup 0's, through the (now idle) P buffer.
  float l[2];
  ShareWg0RowSums(reinterpret_cast<float*>(smem + kPOff), wg, t4, row_lo, l_run, l);
  StoreWgRows(p, split, q0, r0, rows_seq, row_lo, wg, t4, o, l, m_run);
#endif
}

}  // namespace fp8_kernel

template <typename T>
absl::Status LaunchMlaFp8(const LatentParams<T>& p, dim3 grid, cudaStream_t stream) {
  using fp8_kernel::kSmemBytes;
  using fp8_kernel::MlaFp8Kernel;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaFp8Kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  MlaFp8Kernel<T><<<grid, kMlaWgmmaThreads, kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchMlaFp8<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&, dim3,
                                                  cudaStream_t);
template absl::Status LaunchMlaFp8<__half>(const LatentParams<__half>&, dim3, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
