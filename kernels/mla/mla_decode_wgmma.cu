// The Hopper (sm_90a) latent attention kernel behind MlaLatentAttention (mla_cuda.h) for latent
// 512 + 64, bf16 / fp16: FlashMLA's structure with wgmma, our code.
//
// One CTA = 64 (query token x head) rows of one request x one split of its context, two
// warpgroups (256 threads), one CTA per SM (225 KiB of shared memory). Latent tiles of 64 rows x
// 576 dims stream through a 2-stage cp.async ring in the 128-byte-swizzled layout wgmma reads
// (kernels/attention/cuda/prefill_wgmma.cuh); each tile is read from memory once for all 64 rows,
// and Q stays in shared memory for the whole split. Per tile:
//   * warpgroup 0: S[64 rows][64 latents] = Q K^T by wgmma with both operands in shared memory
//     (36 k16 steps over the 576 dims), the online softmax on the accumulators (rows masked per
//     row past their causal end: q_len > 1), P (rounded to T) to shared memory in the A-fragment
//     order with the per-row rescale factors and running sums, then O[:, 0:256] += P V[:, 0:256]
//     with P in registers;
//   * warpgroup 1: waits for P (named barrier 1), rescales its accumulators and runs
//     O[:, 256:512] += P V[:, 256:512]; it keeps the last tile's running sums, so the epilogue
//     has no exchange between the warpgroups (an epilogue hand-over of the row sums behind a
//     __syncthreads() was what compute-sanitizer racecheck flagged, BENCHMARKS.md).
//   Rows past a DCP shard's causal end are masked the same way (LocalKeyEnd).
// V is the tile's first 512 dims, read N-major from the same shared rows as K. The next tile's
// copy is issued at the top of each tile, right after the barrier that retires the stage it
// overwrites (the tile before), so one tile is always in flight while the current one computes.
// The block table is read once per latent row (four threads copy a row), so any page size works.
// Output: the final o_lat / LSE, or fp32 partials per split for MergeF32AttnStatesN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace: the compute_90 pass compiles the kernel body away, and nvcc would
// then flag every helper of internal linkage as unused.
namespace wgmma_kernel {

using internal::prefill::FenceProxyAsync;
using wgmma_common::BarArrive;
using wgmma_common::BarSync;
using wgmma_common::CopyTileRow;
using wgmma_common::LoadP;
using wgmma_common::RescaleAndAddPv;
using wgmma_common::Scores;
using wgmma_common::Softmax;
using wgmma_common::StoreP;
using wgmma_common::StoreWgRows;

inline constexpr int kD = wgmma_common::kTileDim, kRows = 64, kKeys = 64;
constexpr int kTileBytes = wgmma_common::kTileBytes;  // Q, or one latent stage: 72 KiB
constexpr int kPOff = 3 * kTileBytes;                 // P: [4 k16 steps][128 threads] uint4
constexpr int kFOff = kPOff + 4 * 128 * 16;           // per-row state: [128 threads] float4
constexpr int kSmemBytes = kFOff + 128 * 16 + 1024;   // + slack for the 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
static_assert(kRows * 128 == wgmma_common::kChunkBytes && kKeys * 128 == wgmma_common::kChunkBytes);

template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaThreads, 1)
    MlaWgmmaKernel(const __grid_constant__ LatentParams<T> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // wgmma's swizzle is a function of address bits 7-9: blocks must be 1024-byte aligned.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint4* sp = reinterpret_cast<uint4*>(smem + kPOff);
  float4* sf = reinterpret_cast<float4*>(smem + kFOff);

  const LatentCta c = LatentCtaOf(p, kRows);
  if (c.r0 >= c.rows_seq || EmptySplitDone(p, c, kRows)) return;
  const int split = blockIdx.x, q0 = c.q0, rows_seq = c.rows_seq, r0 = c.r0, kb = c.kb, ke = c.ke;
  const int32_t* table = c.table;
  const int num_tiles = c.Tiles(kKeys);
  const int tid = threadIdx.x, wg = tid / 128, wt = tid % 128;
  const int lane = tid % 32, t4 = lane % 4;
  const int row_lo = (wt / 32) * 16 + lane / 4, row_hi = row_lo + 8;

  // Q (zero rows beyond the request's) joins the first tile's copy group.
  const int crow = tid / 4, cpart = tid % 4;
  {
    const bool ok = r0 + crow < rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(q0) * p.heads + r0 + crow) * kD : p.q;
    CopyTileRow(smem, crow, cpart, src, ok);
  }
  auto load_tile = [&](int t) {
    const int key = kb + t * kKeys + crow;
    const bool ok = key < ke;
    CopyTileRow(smem + (1 + t % 2) * kTileBytes, crow, cpart,
                ok ? LatentRow(p, table, key) : p.pool, ok);
  };
  if (num_tiles > 0) load_tile(0);
  CpAsyncCommit();

  const int vis[2] = {c.KeyEnd(p, row_lo), c.KeyEnd(p, row_hi)};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint32_t q_addr = SmemAddr(smem);

  for (int t = 0; t < num_tiles; ++t) {
    CpAsyncWait<0>();
    FenceProxyAsync();  // this thread's copies, before wgmma reads them (async proxy)
    __syncthreads();    // tile t landed everywhere; tile t - 1's stage and P are free
    if (t + 1 < num_tiles) load_tile(t + 1);
    CpAsyncCommit();
    const uint32_t k_addr = q_addr + (1 + t % 2) * kTileBytes;
    uint32_t pa[4][4];
    float alpha[2];
    if (wg == 0) {
      float sc[32];
      Scores<T>(sc, q_addr, k_addr);
      Softmax<T>(sc, kb + t * kKeys, t4, vis, p.scale_log2, m_run, l_run, alpha, pa);
      StoreP(sp, wt, pa);
      // The rows' rescale factors and this thread's running sums: warpgroup 1 keeps the sums of
      // the last tile, so the epilogue needs no exchange of its own.
      sf[wt] = make_float4(alpha[0], alpha[1], l_run[0], l_run[1]);
      BarArrive(1, kMlaWgmmaThreads);
    } else {
      BarSync(1, kMlaWgmmaThreads);
      const float4 f = sf[wt];
      alpha[0] = f.x;
      alpha[1] = f.y;
      l_run[0] = f.z;
      l_run[1] = f.w;
      LoadP(sp, wt, pa);
    }
    RescaleAndAddPv<T>(o, pa, alpha, k_addr, wg);  // O[:, 256 wg .. + 256) = alpha O + P V
  }
  CpAsyncWait<0>();

  // Row sums over the quad of lanes sharing the rows; warpgroup 1 holds warpgroup 0's per-thread
  // sums of the last tile (same thread slot, same rows), so both reduce their own copy.
  QuadSum2(l_run);
  StoreWgRows(p, split, q0, r0, rows_seq, row_lo, wg, t4, o, l_run, m_run);
#endif
}

}  // namespace wgmma_kernel

absl::StatusOr<bool> DeviceIsSm90() {
  int device = 0, major = 0, minor = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

template <typename T>
absl::Status LaunchMlaWgmma(const LatentParams<T>& p, dim3 grid, cudaStream_t stream) {
  using wgmma_kernel::kSmemBytes;
  using wgmma_kernel::MlaWgmmaKernel;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaWgmmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  MlaWgmmaKernel<T><<<grid, kMlaWgmmaThreads, kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchMlaWgmma<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&, dim3,
                                                    cudaStream_t);
template absl::Status LaunchMlaWgmma<__half>(const LatentParams<__half>&, dim3, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
