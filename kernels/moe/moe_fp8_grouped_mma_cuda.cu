// MoeFp8GroupedMma (moe_fp8_cuda.h): every expert's rows against that expert's e4m3 weights on
// the tensor cores (mma.sync m16n8k32 e4m3 x e4m3 -> fp32), in one launch that never reads the
// expert offsets back to the host.
//
// moe_grouped_mma_cuda.cu's layout with bytes for elements: block = BM rows of ONE expert (32 or
// 64) x 128 output columns, 8 warps as 2 (rows) x 4 (columns), each warp MF x 16 rows x 32
// columns. K in 128-wide steps (one scale group: kernels/fp8's 1 x 128 / 128 x 128 blocks)
// through a 4-stage cp.async ring (zero-fill past the expert's rows, n and k); shared tiles are
// 128-byte rows with the 16-byte chunk XOR-swizzled by (row & 7). An e4m3 m16n8k32 fragment has
// the bf16 m16n8k16 fragment's byte layout, so the ldmatrix addressing is the bf16 kernel's.
// Each 32-column MMA starts from zero and is added in fp32 (the FP8 MMA's own accumulation is not
// full fp32: DeepGEMM's promotion, finer); each 128-column step's sum is folded into the
// accumulator times that group's weight scale x activation scale.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mma_e4m3.cuh"
#include "kernels/moe/moe_fp8_cuda.h"
#include "kernels/moe/moe_grouped_tile.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::SmemAddr;
using moe_tile::FindTile;

constexpr int kThreads = 256;
constexpr int kBN = 128, kBK = 128, kStages = 4;
constexpr int kRowBytes = kBK;  // one tile row of 128 e4m3 codes
static_assert(kRowBytes == moe_tile::kRowBytes);

template <int MF>
__host__ __device__ constexpr int StageBytes() {
  return (MF * 32 + kBN) * kRowBytes;
}

struct MmaArgs {
  const uint8_t* a;            // activation codes [*, k]
  const int32_t* a_row_index;  // the row of `a` a permuted row reads, or null: the row itself
  const float* a_scales;
  int a_scale_stride;  // scales per activation row: 0 static, 1 per token, groups for 1x128
  bool a_grouped;
  MoeFp8Experts w;
  const int32_t* offsets;
  int num_experts, n, k;
  __nv_bfloat16* out;
};

using internal::MmaE4m3;  // kernels/cuda/mma_e4m3.cuh

template <int MF>
__global__ void __launch_bounds__(kThreads, MF == 1 ? 2 : 1)
    Fp8GroupedMmaKernel(const __grid_constant__ MmaArgs p) {
  constexpr int BM = MF * 32;
  constexpr int kARows = BM / 32;  // A rows this thread loads per stage (B: 4)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int tile[3];
  FindTile(p.offsets, p.num_experts, static_cast<int>(blockIdx.x), BM, tile);
  __syncthreads();
  const int expert = tile[0];
  if (expert < 0) return;
  const int row0 = tile[1], row_end = tile[2], n = p.n, k = p.k;
  const int n0 = static_cast<int>(blockIdx.y) * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int chunk = tid & 7;
  auto src_row = [&](int r) { return p.a_row_index != nullptr ? p.a_row_index[r] : r; };
  const auto a_row = [&](bool ok, int r) { return src_row(ok ? r : row0); };
  const auto b_row = [&](int col) { return p.w.codes[expert] + static_cast<int64_t>(col) * k; };
  const uint8_t *a_src[kARows], *b_src[4];
  bool a_ok[kARows], b_ok[4];
  moe_tile::InitRows(p.a, a_row, b_row, row0, row_end, n0, n, k, tid, a_src, a_ok, b_src, b_ok);
  const uint32_t base = SmemAddr(smem);
  auto load = [&](int kt, int stage) {
    moe_tile::LoadStage<StageBytes<MF>()>(base, kt, stage, k, tid, chunk, a_src, a_ok, b_src, b_ok);
  };
  const int ktiles = (k + kBK - 1) / kBK;
  moe_tile::RingPrologue<kStages>(ktiles, load);
  const int wm = warp >> 2, wn = warp & 3;  // warp rows wm * MF * 16, columns wn * 32
  // This thread's activation scale rows (mf, half); its weight columns are col0 + nf * 8 + j.
  int as_row[MF][2];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + wm * MF * 16 + mf * 16 + (lane >> 2) + half * 8;
      as_row[mf][half] = src_row(r < row_end ? r : row0) * p.a_scale_stride;
    }
  }
  const float* scales = p.w.scales[expert];
  const int col0 = n0 + wn * 32 + (lane & 3) * 2;
  float acc[MF][4][4] = {};
  for (int kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
    if (kt + kStages - 1 < ktiles) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
    CpAsyncCommit();
    const uint32_t sa = base + (kt % kStages) * StageBytes<MF>(), sb = sa + BM * kRowBytes;
    float part[MF][4][4] = {};
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      uint32_t af[MF][4], bf[2][4];
      moe_tile::LoadFragments<MF>(sa, sb, wm, wn, lane, ks, af, bf);
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          float t[4] = {};  // each 32-column MMA from zero, summed in fp32
          MmaE4m3(t, af[mf], bf[nf >> 1][(nf & 1) * 2], bf[nf >> 1][(nf & 1) * 2 + 1]);
#pragma unroll
          for (int q = 0; q < 4; ++q) part[mf][nf][q] += t[q];
        }
      }
    }
    const int wg = p.w.groups == 1 ? 0 : kt, ag = p.a_grouped ? kt : 0;
    float wsc[4][2];
#pragma unroll
    for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wsc[nf][j] = scales[static_cast<int64_t>(min(col0 + nf * 8 + j, n - 1)) * p.w.groups + wg];
      }
    }
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float sa_row = p.a_scales[as_row[mf][half] + ag];
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            acc[mf][nf][half * 2 + j] =
                fmaf(part[mf][nf][half * 2 + j], sa_row * wsc[nf][j], acc[mf][nf][half * 2 + j]);
          }
        }
      }
    }
  }
  CpAsyncWait<0>();
  moe_tile::StoreTile<MF>(acc, p.out, row0, row_end, n0, n, wm, wn, lane);
}

template <int MF>
absl::Status Launch(const MmaArgs& p, int64_t rows, cudaStream_t stream) {
  constexpr int BM = MF * 32;
  const int bytes = kStages * StageBytes<MF>();
  const auto kernel = Fp8GroupedMmaKernel<MF>;
  // The shared-memory opt-in is a host call: made here unless capturing (MoeFp8GroupedMmaInit
  // made it before capture then).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
  // Tiles: sum over experts of ceil(count / BM) <= ceil(rows / BM) + (experts with rows).
  const int64_t m_tiles = (rows + BM - 1) / BM + std::min<int64_t>(p.num_experts, rows);
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>((p.n + kBN - 1) / kBN));
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeFp8GroupedMmaInit() {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(Fp8GroupedMmaKernel<1>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kStages * StageBytes<1>()));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(Fp8GroupedMmaKernel<2>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kStages * StageBytes<2>()));
  return absl::OkStatus();
}

absl::Status MoeFp8GroupedMma(const MoeFp8Activations& a, const int32_t* a_row_index,
                              const MoeFp8Experts& w, const int32_t* expert_offsets,
                              int64_t num_experts, int64_t rows, int64_t n, int64_t k,
                              __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t groups = (k + kBK - 1) / kBK;
  if (a.scheme == Fp8ActivationScheme::kNone || a.codes == nullptr || a.scales == nullptr ||
      reinterpret_cast<uintptr_t>(a.codes) % 16 != 0 || n < 2 || n % 2 != 0 || n > 65535 * kBN ||
      k < 16 || k % 16 != 0 || k > 0x7fffffff || (w.groups != 1 && w.groups != groups) ||
      w.codes == nullptr || w.scales == nullptr || expert_offsets == nullptr || out == nullptr ||
      reinterpret_cast<uintptr_t>(out) % 4 != 0 || num_experts < 1 ||
      num_experts > kMoeMaxExperts || rows < 0 || rows > 0x3fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeFp8GroupedMma: FP8 activation codes and scales (16-byte aligned), outputs ", n,
        " (even), inputs ", k, " (a positive multiple of 16), weight groups ", w.groups, " (1 or ",
        groups, "), experts ", num_experts, " (1..", kMoeMaxExperts, "), rows ", rows));
  }
  if (rows == 0) return absl::OkStatus();
  MmaArgs p{};
  p.a = a.codes;
  p.a_row_index = a_row_index;
  p.a_scales = a.scales;
  p.a_scale_stride = a.scheme == Fp8ActivationScheme::kStaticTensor      ? 0
                     : a.scheme == Fp8ActivationScheme::kDynamicGroup128 ? static_cast<int>(groups)
                                                                         : 1;
  p.a_grouped = a.scheme == Fp8ActivationScheme::kDynamicGroup128;
  p.w = w;
  p.offsets = expert_offsets;
  p.num_experts = static_cast<int>(num_experts);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.out = out;
  // 32-row tiles while experts average <= 32 rows (decode), else 64.
  if (rows <= 32 * num_experts) return Launch<1>(p, rows, stream);
  return Launch<2>(p, rows, stream);
}

}  // namespace tandem::kernels::cuda
