#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/fp8/fp8_gemm_kernels.h"

namespace tandem::kernels::cuda {
namespace {

// One thread per output element, consecutive threads write consecutive tokens of one group
// (coalesced stores; the reads stride by `groups`, a few floats per token: tiny next to the GEMM).
__global__ void TransposeGroupScalesKernel(const float* __restrict__ scales, int64_t m,
                                           int64_t groups, float* __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < m * groups;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = e / m, i = e % m;
    out[e] = scales[i * groups + g];
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
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((m * groups + kThreads - 1) / kThreads, 4096));
  TransposeGroupScalesKernel<<<blocks, kThreads, 0, stream>>>(scales, m, groups, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
