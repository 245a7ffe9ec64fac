#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/rope_cache_cuda.h"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;
using internal::VecToFloat;

constexpr int kVec = 8;
constexpr int kThreads = 256;
using V8 = float[kVec];

// Rotates the pair of 8-element vectors (i0, i0 + half) of one head exactly as cuda::ApplyRope
// does: fp32 sincosf of float(position) * inv_freq, one rounding to T.
template <typename T>
__device__ __forceinline__ void RotatePair(const T* __restrict__ src, int i0, int half, float pos,
                                           const float* __restrict__ inv_freq, Vec<T, kVec>& o1,
                                           Vec<T, kVec>& o2) {
  V8 x1, x2;
  VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(src + i0), x1);
  VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(src + i0 + half), x2);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float s, c;
    sincosf(pos * inv_freq[i0 + j], &s, &c);
    o1.v[j] = FromFloat<T>(x1[j] * c + (-x2[j]) * s);
    o2.v[j] = FromFloat<T>(x2[j] * c + x1[j] * s);
  }
}

// An fp8 pool's code of each T value: ReshapeAndCache's (true division by the scale, then
// FromFloat's round-to-nearest with saturation), so the pool holds what ReshapeAndCache would
// store from the T values a T pool would hold.
template <typename KV, typename T>
__device__ __forceinline__ Vec<KV, kVec> Quantize(const Vec<T, kVec>& x, float scale) {
  Vec<KV, kVec> out;
#pragma unroll
  for (int j = 0; j < kVec; ++j) out.v[j] = FromFloat<KV>(ToFloat(x.v[j]) / scale);
  return out;
}

// One thread per (token, head, 8-element vector of the first half): q and k heads rotate the
// pair (i0, i0 + half) exactly as cuda::ApplyRope does; v heads copy both vectors. KV: the pool's
// element type, T (copied) or __nv_fp8_e4m3 (quantized with k_scale / v_scale, per kv head when
// per_head_scale; unused for a T pool).
template <typename T, typename KV>
__global__ void __launch_bounds__(kThreads)
    RopeQkvToCacheKernel(const T* __restrict__ qkv, int64_t qkv_stride,
                         const int64_t* __restrict__ positions,
                         const int64_t* __restrict__ slot_mapping, int64_t num_tokens,
                         const float* __restrict__ inv_freq, int head_dim, int num_q_heads,
                         int num_kv_heads, T* __restrict__ q_out, KV* __restrict__ pool,
                         int64_t num_slots, int block_size, int64_t layer_tile_offset,
                         int64_t block_stride, int64_t kv_stride, const float* __restrict__ k_scale,
                         const float* __restrict__ v_scale, bool per_head_scale) {
  // PDL (the caller's `pdl`): qkv is the previous kernel's; the paged decode kernel behind this
  // one may start (it reads q and the pool only after its own wait). No-ops without the attribute.
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  const int half = head_dim / 2;
  const int vecs_per_head = half / kVec;
  const int heads = num_q_heads + 2 * num_kv_heads;
  const int64_t total = num_tokens * heads * vecs_per_head;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t t = idx / (heads * vecs_per_head);
    const int rem = static_cast<int>(idx % (heads * vecs_per_head));
    const int h = rem / vecs_per_head;
    const int i0 = (rem % vecs_per_head) * kVec;
    const T* src = qkv + t * qkv_stride + int64_t{h} * head_dim;
    T* dst;  // q_out's row, or a T pool's k row
    if (h < num_q_heads) {
      dst = q_out + (t * num_q_heads + h) * head_dim;
    } else {
      const int64_t slot = slot_mapping[t];
      if (slot < 0 || slot >= num_slots) continue;
      const int kv = h < num_q_heads + num_kv_heads ? 0 : 1;
      const int kv_head = h - num_q_heads - kv * num_kv_heads;
      KV* pool_row = pool + (slot / block_size) * block_stride + layer_tile_offset +
                     kv * kv_stride +
                     ((slot % block_size) * num_kv_heads + kv_head) * int64_t{head_dim};
      if constexpr (std::is_same_v<T, KV>) {
        if (kv == 1) {
          *reinterpret_cast<Vec<T, kVec>*>(pool_row + i0) =
              *reinterpret_cast<const Vec<T, kVec>*>(src + i0);
          *reinterpret_cast<Vec<T, kVec>*>(pool_row + i0 + half) =
              *reinterpret_cast<const Vec<T, kVec>*>(src + i0 + half);
          continue;
        }
        dst = pool_row;
      } else {
        const int scale_head = per_head_scale ? kv_head : 0;
        Vec<T, kVec> o1, o2;
        if (kv == 1) {
          o1 = *reinterpret_cast<const Vec<T, kVec>*>(src + i0);
          o2 = *reinterpret_cast<const Vec<T, kVec>*>(src + i0 + half);
        } else {
          RotatePair(src, i0, half, static_cast<float>(positions[t]), inv_freq, o1, o2);
        }
        const float scale = kv == 1 ? v_scale[scale_head] : k_scale[scale_head];
        *reinterpret_cast<Vec<KV, kVec>*>(pool_row + i0) = Quantize<KV>(o1, scale);
        *reinterpret_cast<Vec<KV, kVec>*>(pool_row + i0 + half) = Quantize<KV>(o2, scale);
        continue;
      }
    }
    Vec<T, kVec> o1, o2;
    RotatePair(src, i0, half, static_cast<float>(positions[t]), inv_freq, o1, o2);
    *reinterpret_cast<Vec<T, kVec>*>(dst + i0) = o1;
    *reinterpret_cast<Vec<T, kVec>*>(dst + i0 + half) = o2;
  }
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

namespace rope_internal {

absl::Status ValidateRopeQkvShape(const char* name, const DeviceKvCache& cache, KvDtype own,
                                  int64_t layer, int64_t num_tokens, int64_t num_q_heads,
                                  int64_t qkv_stride, int64_t max_head_dim) {
  auto invalid = [name](const auto&... args) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::", name, ": ", args...));
  };
  // Also refuses an fp8 pool without k_scale / v_scale.
  RETURN_IF_ERROR(ValidateDeviceKvCache(cache, name));
  const KvCacheLayout& l = cache.layout;
  if (cache.dtype != own && cache.dtype != KvDtype::kFp8E4m3) {
    return invalid("the pool must hold the activations' dtype (", KvDtypeName(own),
                   ") or fp8_e4m3, got ", KvDtypeName(cache.dtype));
  }
  if (layer < 0 || layer >= l.num_layers) return invalid("layer ", layer, " out of range");
  if (num_tokens < 0 || num_q_heads <= 0) return invalid("negative sizes");
  const int64_t D = l.head_dim;
  if ((D / 2) % kVec != 0 || (max_head_dim > 0 && D > max_head_dim)) {
    return invalid("head_dim / 2 must be a multiple of 8",
                   max_head_dim > 0 ? absl::StrCat(" and head_dim <= ", max_head_dim) : "",
                   ", got ", D);
  }
  if (qkv_stride < (num_q_heads + 2 * l.num_kv_heads) * D || qkv_stride % kVec != 0) {
    return invalid("qkv_stride ", qkv_stride, " must cover a row and be a multiple of 8");
  }
  return absl::OkStatus();
}

}  // namespace rope_internal

template <typename T>
absl::Status RopeQkvToCache(const T* qkv, int64_t qkv_stride, const int64_t* positions,
                            const int64_t* slot_mapping, int64_t num_tokens, const float* inv_freq,
                            int64_t num_q_heads, T* q_out, const DeviceKvCache& cache,
                            int64_t layer, cudaStream_t stream, bool pdl) {
  auto invalid = [](const auto&... args) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::RopeQkvToCache: ", args...));
  };
  constexpr KvDtype kOwn = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  RETURN_IF_ERROR(rope_internal::ValidateRopeQkvShape("RopeQkvToCache", cache, kOwn, layer,
                                                      num_tokens, num_q_heads, qkv_stride,
                                                      /*max_head_dim=*/0));
  const KvCacheLayout& l = cache.layout;
  const int64_t D = l.head_dim;
  if (num_tokens == 0) return absl::OkStatus();
  if (qkv == nullptr || positions == nullptr || slot_mapping == nullptr || inv_freq == nullptr ||
      q_out == nullptr || !Aligned(qkv) || !Aligned(q_out)) {
    return invalid("null or unaligned pointers");
  }
  const int64_t work = num_tokens * (num_q_heads + 2 * l.num_kv_heads) * (D / 2 / kVec);
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, int64_t{1} << 30);
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                                         stream, pdl);
  auto launch = [&](auto* pool) {
    using KV = std::remove_pointer_t<decltype(pool)>;
    return cudaLaunchKernelEx(config.get(), RopeQkvToCacheKernel<T, KV>, qkv, qkv_stride, positions,
                              slot_mapping, num_tokens, inv_freq, static_cast<int>(D),
                              static_cast<int>(num_q_heads), static_cast<int>(l.num_kv_heads),
                              q_out, pool, l.NumSlots(), static_cast<int>(l.block_size),
                              l.TileOffset(0, layer, 0), l.BlockElems(), l.TileElems(),
                              cache.k_scale, cache.v_scale, cache.per_head_scale);
  };
  CUDA_RETURN_IF_ERROR(cache.dtype == KvDtype::kFp8E4m3
                           ? launch(static_cast<__nv_fp8_e4m3*>(cache.data))
                           : launch(static_cast<T*>(cache.data)));
  return absl::OkStatus();
}

template absl::Status RopeQkvToCache<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const int64_t*,
                                                    const int64_t*, int64_t, const float*, int64_t,
                                                    __nv_bfloat16*, const DeviceKvCache&, int64_t,
                                                    cudaStream_t, bool);
template absl::Status RopeQkvToCache<__half>(const __half*, int64_t, const int64_t*, const int64_t*,
                                             int64_t, const float*, int64_t, __half*,
                                             const DeviceKvCache&, int64_t, cudaStream_t, bool);

}  // namespace tandem::kernels::cuda
