#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "runtime/cuda/dummy_init.h"

namespace tandem::runtime::cuda {
namespace {

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// One element per thread (its pair's draw is recomputed by the neighbour: the kernel is bound
// by the double-precision log / sincos, not by Philox, and stays far under a second for 8B).
template <typename T>
__global__ void FillDummySliceKernel(T* out, DummySlice slice, float mean, uint64_t seed,
                                     uint64_t stream_id) {
  const int64_t n = slice.numel();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(DummyValue(seed, stream_id, slice.GlobalIndex(i), mean));
  }
}

}  // namespace

template <typename T>
absl::Status FillDummySlice(T* out, const DummySlice& slice, float mean, uint64_t seed,
                            uint64_t stream_id, cudaStream_t stream) {
  if (slice.num_rows < 0 || slice.num_cols < 0 || slice.row_begin < 0 || slice.col_begin < 0 ||
      slice.col_begin + slice.num_cols > slice.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("FillDummySlice: bad slice rows ", slice.row_begin, "+", slice.num_rows,
                     " cols ", slice.col_begin, "+", slice.num_cols, " of ", slice.cols));
  }
  const int64_t n = slice.numel();
  if (n == 0) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("FillDummySlice: null output");
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 32);
  FillDummySliceKernel<T>
      <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(out, slice, mean, seed, stream_id);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status FillDummySlice<float>(float*, const DummySlice&, float, uint64_t, uint64_t,
                                            cudaStream_t);
template absl::Status FillDummySlice<__nv_bfloat16>(__nv_bfloat16*, const DummySlice&, float,
                                                    uint64_t, uint64_t, cudaStream_t);
template absl::Status FillDummySlice<__half>(__half*, const DummySlice&, float, uint64_t, uint64_t,
                                             cudaStream_t);

}  // namespace tandem::runtime::cuda
