// MlaWriteLatentFp8 (mla_cuda.h): latent rows into an FP8 latent pool, one scale per row.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

// One warp per token: max|row| over the lanes, scale = max / 448 (1 for a zero row), each value
// x / scale rounded to the nearest e4m3 (ties to even, saturated): the fp32 operations of
// cpu::QuantizeLatentRowFp8, IEEE-rounded (__fdiv_rn) so the codes are bit-exact.
template <typename T>
__global__ void WriteLatentFp8Kernel(const T* c_kv, int64_t c_kv_stride, const T* k_pe,
                                     int64_t k_pe_stride, const int64_t* slots, int64_t num_tokens,
                                     int lora, int dim, int block_size, int64_t code_stride,
                                     int64_t scale_stride, int64_t layer_offset, uint8_t* codes,
                                     float* scales) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= num_tokens) return;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  auto value = [&](int c) {
    return internal::ToFloat(c < lora ? c_kv[t * c_kv_stride + c]
                                      : k_pe[t * k_pe_stride + (c - lora)]);
  };
  float amax = 0.0f;
  for (int c = lane; c < dim; c += 32) amax = fmaxf(amax, fabsf(value(c)));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  const int64_t b = slot / block_size;
  const int64_t in = layer_offset + (slot % block_size) * int64_t{dim};  // within block b
  uint8_t* row = codes + b * code_stride + in;
  for (int c = lane; c < dim; c += 32) {
    row[c] = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__fdiv_rn(value(c), scale), __NV_SATFINITE, __NV_E4M3));
  }
  if (lane == 0) scales[b * scale_stride + in / dim] = scale;
}

}  // namespace

template <typename T>
absl::Status MlaWriteLatentFp8(const T* c_kv, int64_t c_kv_stride, const T* k_pe,
                               int64_t k_pe_stride, const int64_t* slot_mapping, int64_t num_tokens,
                               const MlaDims& dims, const DeviceKvCache& cache, int64_t layer,
                               cudaStream_t stream) {
  RETURN_IF_ERROR(dims.Validate());
  RETURN_IF_ERROR(mla_internal::CheckLatentPool<T>(cache, dims, layer, "MlaWriteLatentFp8",
                                                   /*fp8_ok=*/true));
  if (cache.dtype != KvDtype::kFp8E4m3 || num_tokens < 0 || c_kv_stride < dims.kv_lora_rank ||
      k_pe_stride < dims.qk_rope_head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaWriteLatentFp8: a ", KvDtypeName(cache.dtype), " pool, ", num_tokens,
                     " tokens, strides ", c_kv_stride, ", ", k_pe_stride));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (c_kv == nullptr || k_pe == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("MlaWriteLatentFp8: null pointer");
  }
  constexpr int kWarps = 8;
  const mla_internal::Fp8BlockStrides strides = mla_internal::Fp8Strides(cache);
  WriteLatentFp8Kernel<T>
      <<<static_cast<unsigned>((num_tokens + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
          c_kv, c_kv_stride, k_pe, k_pe_stride, slot_mapping, num_tokens,
          static_cast<int>(dims.kv_lora_rank), static_cast<int>(dims.LatentDim()),
          static_cast<int>(cache.layout.block_size), strides.codes, strides.scales,
          cache.layout.TileOffset(0, layer, 0), static_cast<uint8_t*>(cache.data),
          cache.token_scales);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status MlaWriteLatentFp8<__nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                       const __nv_bfloat16*, int64_t,
                                                       const int64_t*, int64_t, const MlaDims&,
                                                       const DeviceKvCache&, int64_t, cudaStream_t);
template absl::Status MlaWriteLatentFp8<__half>(const __half*, int64_t, const __half*, int64_t,
                                                const int64_t*, int64_t, const MlaDims&,
                                                const DeviceKvCache&, int64_t, cudaStream_t);

}  // namespace tandem::kernels::cuda
