#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/fp8/fp8_gemm_kernels.h"

namespace tandem::kernels::cuda {
namespace {

// A 32 x 32 tile of [m, groups] per block, through shared memory: coalesced reads along the
// groups and coalesced writes along the tokens, no 64-bit division per element (the previous
// one-thread-per-element form took 3.6-11.6 us at 2k-8k tokens on an H200, up to 10% of the
// block GEMM it feeds: kernels/fp8/BENCHMARKS.md, twenty-eighth session). Blocks of 32 x 8
// threads, each thread 4 rows of the tile; y-tiles strided over the grid.
constexpr int kTile = 32;
constexpr int kTileRows = 8;
__global__ void TransposeGroupScalesKernel(const float* __restrict__ scales, int64_t m,
                                           int64_t groups, float* __restrict__ out) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t g0 = int64_t{blockIdx.x} * kTile;
  for (int64_t i0 = int64_t{blockIdx.y} * kTile; i0 < m; i0 += int64_t{gridDim.y} * kTile) {
#pragma unroll
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {  // rows i0 + r, groups g0 + x
      const int64_t i = i0 + r, g = g0 + threadIdx.x;
      if (i < m && g < groups) tile[r][threadIdx.x] = scales[i * groups + g];
    }
    __syncthreads();
#pragma unroll
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {  // groups g0 + r, rows i0 + x
      const int64_t g = g0 + r, i = i0 + threadIdx.x;
      if (g < groups && i < m) out[g * m + i] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

}  // namespace

absl::Status TransposeGroupScales(const float* scales, int64_t m, int64_t groups, float* out,
                                  cudaStream_t stream) {
  if (scales == nullptr || out == nullptr || m < 0 || groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransposeGroupScales: needs non-null buffers, m >= 0, groups >= 1; got m=", m,
                     " groups=", groups));
  }
  if (m == 0) return absl::OkStatus();
  const int64_t x_tiles = (groups + kTile - 1) / kTile;
  if (x_tiles > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransposeGroupScales: groups=", groups, " beyond 65535 x 32"));
  }
  const dim3 grid(static_cast<unsigned>(x_tiles),
                  static_cast<unsigned>(std::min<int64_t>((m + kTile - 1) / kTile, 65535)));
  TransposeGroupScalesKernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(scales, m, groups, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
