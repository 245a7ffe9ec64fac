// MoeGroupedMma (moe_cuda.h): every expert's rows of the permuted batch against that expert's
// weights in one launch, without reading the expert offsets back to the host.
//
// Block = one (m-tile, n-tile): BM rows of ONE expert (64 or 128) x 128 output columns, 8 warps
// as 2 (rows) x 4 (columns), each warp MF x 16 rows x 32 columns of m16n8k16 mma.sync. K in
// 64-wide steps through a 3-stage cp.async ring (zero-fill past the expert's rows, n and k);
// shared tiles are 128-byte rows with the 16-byte chunk XOR-swizzled by (row & 7), so the
// ldmatrix reads are conflict-free. blockIdx.x is the m-tile (fastest), blockIdx.y the n-tile:
// the m-tiles sharing one expert's weight tile run together. Each block finds its expert by a
// warp scan of ceil(count / BM) over the offsets; blocks past the last tile exit.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_grouped_tile.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::Mma16816;
using internal::SmemAddr;
using moe_tile::FindTile;

constexpr int kThreads = 256;
constexpr int kBN = 128, kBK = 64, kStages = 3;
constexpr int kRowBytes = kBK * 2;  // 128: one tile row of 64 two-byte elements
static_assert(kRowBytes == moe_tile::kRowBytes);

template <int MF>
__host__ __device__ constexpr int StageBytes() {
  return (MF * 32 + kBN) * kRowBytes;
}

template <typename T, int MF>
__global__ void __launch_bounds__(kThreads)
    GroupedMmaKernel(const T* __restrict__ a, const int32_t* __restrict__ a_row_index,
                     const T* __restrict__ w, const int32_t* __restrict__ offsets, int num_experts,
                     int n, int k, T* __restrict__ out) {
  constexpr int BM = MF * 32;
  constexpr int kARows = BM / 32;  // A rows this thread loads per stage (B: 4)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int tile[3];
  FindTile(offsets, num_experts, static_cast<int>(blockIdx.x), BM, tile);
  __syncthreads();
  const int expert = tile[0];
  if (expert < 0) return;
  const int row0 = tile[1], row_end = tile[2];
  const int n0 = static_cast<int>(blockIdx.y) * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int chunk = tid & 7;  // the 16-byte chunk of a tile row this thread copies
  const auto a_row = [&](bool ok, int r) {
    return ok ? (a_row_index != nullptr ? a_row_index[r] : r)
              : (a_row_index != nullptr ? a_row_index[row0] : row0);
  };
  const auto b_row = [&](int col) { return w + (static_cast<int64_t>(expert) * n + col) * k; };
  const T *a_src[kARows], *b_src[4];
  bool a_ok[kARows], b_ok[4];
  moe_tile::InitRows(a, a_row, b_row, row0, row_end, n0, n, k, tid, a_src, a_ok, b_src, b_ok);
  const uint32_t base = SmemAddr(smem);
  auto load = [&](int kt, int stage) {
    moe_tile::LoadStage<StageBytes<MF>()>(base, kt, stage, k, tid, chunk, a_src, a_ok, b_src, b_ok);
  };
  const int ktiles = (k + kBK - 1) / kBK;
  moe_tile::RingPrologue<kStages>(ktiles, load);
  const int wm = warp >> 2, wn = warp & 3;  // warp rows wm * MF * 16, columns wn * 32
  float acc[MF][4][4];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mf][nf][q] = 0.0f;
    }
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
    if (kt + kStages - 1 < ktiles) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
    CpAsyncCommit();
    const uint32_t sa = base + (kt % kStages) * StageBytes<MF>(), sb = sa + BM * kRowBytes;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[MF][4], bf[2][4];
      moe_tile::LoadFragments<MF>(sa, sb, wm, wn, lane, ks, af, bf);
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          Mma16816<T>(acc[mf][nf], af[mf], bf[nf >> 1][(nf & 1) * 2],
                      bf[nf >> 1][(nf & 1) * 2 + 1]);
        }
      }
    }
  }
  CpAsyncWait<0>();
  moe_tile::StoreTile<MF>(acc, out, row0, row_end, n0, n, wm, wn, lane);
}

template <typename T, int MF>
absl::Status Launch(const T* a, const int32_t* a_row_index, const T* w, const int32_t* offsets,
                    int64_t num_experts, int64_t rows, int64_t n, int64_t k, T* out,
                    cudaStream_t stream) {
  constexpr int BM = MF * 32;
  const int bytes = kStages * StageBytes<MF>();
  const auto kernel = GroupedMmaKernel<T, MF>;
  // The shared-memory opt-in is a host call: made here unless capturing (MoeGroupedMmaInit made
  // it before capture then).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
  // Tiles: sum over experts of ceil(count / BM) <= ceil(rows / BM) + (experts with rows).
  const int64_t m_tiles = (rows + BM - 1) / BM + std::min(num_experts, rows);
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>((n + kBN - 1) / kBN));
  kernel<<<grid, kThreads, bytes, stream>>>(a, a_row_index, w, offsets,
                                            static_cast<int>(num_experts), static_cast<int>(n),
                                            static_cast<int>(k), out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeGroupedMmaInit() {
  const auto set = [](auto kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  };
  CUDA_RETURN_IF_ERROR(set(GroupedMmaKernel<__nv_bfloat16, 2>, kStages * StageBytes<2>()));
  CUDA_RETURN_IF_ERROR(set(GroupedMmaKernel<__nv_bfloat16, 4>, kStages * StageBytes<4>()));
  CUDA_RETURN_IF_ERROR(set(GroupedMmaKernel<__half, 2>, kStages * StageBytes<2>()));
  CUDA_RETURN_IF_ERROR(set(GroupedMmaKernel<__half, 4>, kStages * StageBytes<4>()));
  return absl::OkStatus();
}

bool MoeGroupedMmaSupported(const void* a, const void* w, int64_t n, int64_t k) {
  return n >= 8 && k >= 8 && n % 8 == 0 && k % 8 == 0 && n <= 65535 * kBN && k <= 0x7fffffff &&
         reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

template <typename T>
absl::Status MoeGroupedMma(const T* a, const int32_t* a_row_index, const T* w,
                           const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                           int64_t n, int64_t k, T* out, cudaStream_t stream) {
  if (!MoeGroupedMmaSupported(a, w, n, k) || reinterpret_cast<uintptr_t>(out) % 4 != 0 ||
      num_experts < 1 || num_experts > kMoeMaxExperts || rows < 0 || rows > 0x3fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeGroupedMma: n ", n, ", k ", k, " (multiples of 8, 16-byte aligned operands), experts ",
        num_experts, ", rows ", rows));
  }
  if (rows == 0) return absl::OkStatus();
  // 64-row tiles while experts average <= 64 rows (Qwen3-30B-A3B at ~1k tokens), else 128.
  if (rows <= 64 * num_experts) {
    return Launch<T, 2>(a, a_row_index, w, expert_offsets, num_experts, rows, n, k, out, stream);
  }
  return Launch<T, 4>(a, a_row_index, w, expert_offsets, num_experts, rows, n, k, out, stream);
}

template absl::Status MoeGroupedMma<__nv_bfloat16>(const __nv_bfloat16*, const int32_t*,
                                                   const __nv_bfloat16*, const int32_t*, int64_t,
                                                   int64_t, int64_t, int64_t, __nv_bfloat16*,
                                                   cudaStream_t);
template absl::Status MoeGroupedMma<__half>(const __half*, const int32_t*, const __half*,
                                            const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                            __half*, cudaStream_t);

}  // namespace tandem::kernels::cuda
