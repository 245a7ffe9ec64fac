// bf16/fp16/fp8: one thread moves one 16-byte vector of input (8 elements) per step; a token's
// K and V rows are contiguous in both the input and the pool tile, so the accesses coalesce
// across the block. int8: one warp per (token, kv head) row, since the row's scale needs its
// max|x| first (a warp reduction) before any element can be stored.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/reshape_and_cache_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // input elements per thread step (16 bytes of bf16/fp16)

struct WriteParams {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t row;  // num_kv_heads * head_dim elements
  int64_t head_dim;
  int64_t num_slots;
  int64_t block_size;
  int64_t block_elems;
  int64_t tile_elems;
  int64_t layer_offset;  // TileOffset(0, layer, 0)
  int64_t k_stride, v_stride;
  const float* k_scale;
  const float* v_scale;
  bool per_head_scale;
  float* token_scales;  // int8 only
};

// Thread = one 16-byte vector of one token's K and V row; a flat grid-stride loop over
// tokens x vectors keeps every thread busy whatever the row width.
template <typename T, typename KV>
__global__ void __launch_bounds__(kThreads)
    ReshapeAndCacheKernel(const T* __restrict__ k, const T* __restrict__ v,
                          const int64_t* __restrict__ slot_mapping, KV* __restrict__ pool,
                          const WriteParams p) {
  const int64_t vecs = p.row / kVec;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < p.num_tokens * vecs;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t t = idx / vecs;
    const int64_t i = (idx % vecs) * kVec;
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= p.num_slots) continue;
    const int64_t block = slot / p.block_size;
    const int64_t offset = slot % p.block_size;
    KV* k_dst = pool + block * p.block_elems + p.layer_offset + offset * p.row;
    KV* v_dst = k_dst + p.tile_elems;
    const T* k_src = k + t * p.k_stride;
    const T* v_src = v + t * p.v_stride;
    const auto kx = *reinterpret_cast<const Vec<T, kVec>*>(k_src + i);
    const auto vx = *reinterpret_cast<const Vec<T, kVec>*>(v_src + i);
    if constexpr (std::is_same_v<T, KV>) {
      *reinterpret_cast<Vec<T, kVec>*>(k_dst + i) = kx;
      *reinterpret_cast<Vec<T, kVec>*>(v_dst + i) = vx;
    } else {
      const int64_t head = p.per_head_scale ? i / p.head_dim : 0;
      // Divide (not multiply by a reciprocal): stored = round(x / scale) exactly as documented.
      const float k_scale = p.k_scale[head];
      const float v_scale = p.v_scale[head];
      Vec<KV, kVec> ko, vo;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        ko.v[j] = FromFloat<KV>(ToFloat(kx.v[j]) / k_scale);
        vo.v[j] = FromFloat<KV>(ToFloat(vx.v[j]) / v_scale);
      }
      *reinterpret_cast<Vec<KV, kVec>*>(k_dst + i) = ko;
      *reinterpret_cast<Vec<KV, kVec>*>(v_dst + i) = vo;
    }
  }
}

// One warp quantizes one row of head_dim values to int8 (Int8QuantizeRow's rules, same fp32
// operations, so the host twin is bit-exact): lanes stride over the row twice, once for max|x|
// and once to store; the second pass re-reads the row from L1.
template <typename T>
__device__ __forceinline__ void QuantizeRowInt8(const T* __restrict__ src, int8_t* __restrict__ dst,
                                                float* __restrict__ scale_dst, int64_t n,
                                                int lane) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = lane; i < n; i += 32) {
    const float x = ToFloat(src[i]);
    finite = finite && isfinite(x);
    amax = fmaxf(amax, fabsf(x));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  finite = __all_sync(0xffffffffu, finite);
  const bool zero = !finite || amax == 0.0f;  // store zeros
  const float scale = !finite ? __int_as_float(0x7fc00000) : amax == 0.0f ? 1.0f : amax / 127.0f;
  for (int64_t i = lane; i < n; i += 32) {
    int r = 0;
    if (!zero) r = min(127, max(-127, __float2int_rn(ToFloat(src[i]) / scale)));
    dst[i] = static_cast<int8_t>(r);
  }
  if (lane == 0) *scale_dst = scale;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ReshapeAndCacheInt8Kernel(const T* __restrict__ k, const T* __restrict__ v,
                              const int64_t* __restrict__ slot_mapping, int8_t* __restrict__ pool,
                              const WriteParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t stride = int64_t{gridDim.x} * (kThreads / 32);
  // The loop bounds and the slot test are warp-uniform, as the shuffles inside need.
  for (int64_t item = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
       item < p.num_tokens * p.num_heads; item += stride) {
    const int64_t t = item / p.num_heads;
    const int64_t h = item % p.num_heads;
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= p.num_slots) continue;
    const int64_t block = slot / p.block_size;
    const int64_t offset = slot % p.block_size;
    const int64_t k_dst = block * p.block_elems + p.layer_offset + offset * p.row + h * p.head_dim;
    const int64_t v_dst = k_dst + p.tile_elems;
    QuantizeRowInt8(k + t * p.k_stride + h * p.head_dim, pool + k_dst,
                    p.token_scales + k_dst / p.head_dim, p.head_dim, lane);
    QuantizeRowInt8(v + t * p.v_stride + h * p.head_dim, pool + v_dst,
                    p.token_scales + v_dst / p.head_dim, p.head_dim, lane);
  }
}

template <typename T>
constexpr KvDtype OwnDtype() {
  return std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
}

}  // namespace

template <typename T>
absl::Status ReshapeAndCache(const T* k, const T* v, const int64_t* slot_mapping,
                             int64_t num_tokens, int64_t layer, const DeviceKvCache& cache,
                             cudaStream_t stream, int64_t k_token_stride, int64_t v_token_stride) {
  constexpr const char* kOp = "cuda::ReshapeAndCache";
  RETURN_IF_ERROR(ValidateDeviceKvCache(cache, kOp));
  const KvCacheLayout& layout = cache.layout;
  if (layer < 0 || layer >= layout.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": layer ", layer, " out of range [0, ", layout.num_layers, ")"));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": num_tokens must be >= 0, got ", num_tokens));
  }
  if (cache.dtype != OwnDtype<T>() && cache.dtype != KvDtype::kFp8E4m3 &&
      cache.dtype != KvDtype::kInt8) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": input type does not match the ", KvDtypeName(cache.dtype), " pool"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": k, v and slot_mapping must be non-null"));
  }
  WriteParams p;
  p.num_tokens = num_tokens;
  p.num_heads = layout.num_kv_heads;
  p.row = layout.num_kv_heads * layout.head_dim;
  p.head_dim = layout.head_dim;
  p.num_slots = layout.NumSlots();
  p.block_size = layout.block_size;
  p.block_elems = layout.BlockElems();
  p.tile_elems = layout.TileElems();
  p.layer_offset = layout.TileOffset(0, layer, 0);
  p.k_stride = k_token_stride < 0 ? p.row : k_token_stride;
  p.v_stride = v_token_stride < 0 ? p.row : v_token_stride;
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  p.per_head_scale = cache.per_head_scale;
  p.token_scales = cache.token_scales;
  if (p.k_stride < p.row || p.v_stride < p.row) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": token strides ", p.k_stride, ", ",
                                                   p.v_stride, " smaller than a row of ", p.row));
  }
  // Vector accesses: every row start must be 16-byte aligned.
  const bool aligned = reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v) % 16 == 0 && p.k_stride % kVec == 0 &&
                       p.v_stride % kVec == 0 && p.head_dim % kVec == 0;
  if (!aligned) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": k/v rows must be 16-byte aligned (pointers, strides, head_dim)"));
  }
  const int64_t blocks = (num_tokens * (p.row / kVec) + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 20)));
  if (cache.dtype == KvDtype::kInt8) {
    const int64_t warps_per_cta = kThreads / 32;
    const int64_t ctas = (num_tokens * layout.num_kv_heads + warps_per_cta - 1) / warps_per_cta;
    ReshapeAndCacheInt8Kernel<T>
        <<<static_cast<unsigned>(std::min<int64_t>(ctas, int64_t{1} << 20)), kThreads, 0, stream>>>(
            k, v, slot_mapping, static_cast<int8_t*>(cache.data), p);
  } else if (cache.dtype == KvDtype::kFp8E4m3) {
    ReshapeAndCacheKernel<T, __nv_fp8_e4m3><<<grid, kThreads, 0, stream>>>(
        k, v, slot_mapping, static_cast<__nv_fp8_e4m3*>(cache.data), p);
  } else {
    ReshapeAndCacheKernel<T, T>
        <<<grid, kThreads, 0, stream>>>(k, v, slot_mapping, static_cast<T*>(cache.data), p);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status ReshapeAndCache<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                     const int64_t*, int64_t, int64_t,
                                                     const DeviceKvCache&, cudaStream_t, int64_t,
                                                     int64_t);
template absl::Status ReshapeAndCache<__half>(const __half*, const __half*, const int64_t*, int64_t,
                                              int64_t, const DeviceKvCache&, cudaStream_t, int64_t,
                                              int64_t);

}  // namespace tandem::kernels::cuda
