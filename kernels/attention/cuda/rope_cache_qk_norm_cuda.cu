// QkNormRopeQkvToCache (rope_cache_cuda.h): Qwen3's per-head q/k RMSNorm fused into the RoPE +
// KV-write kernel. A separate translation unit, so RopeQkvToCache's own kernel is untouched.
#include <algorithm>
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

constexpr int kWarps = 8;
constexpr int kMaxHeadDim = 1024;

// One warp per (token, head). q / k heads: the head's RMSNorm with QkHeadRmsNorm's arithmetic
// (kernels/layers/cuda/head_norm_cuda.cu: lane l holds elements l + 32 i, fmaf sum of squares in
// i order, xor-shuffle reduction, rsqrtf(sum / head_dim + eps), round_T((v * inv_rms) * w)),
// staged in shared memory as T, then rotated with RopeQkvToCache's fp32 arithmetic (sincosf of
// float(position) * inv_freq[i], one rounding) into q_out or the pool. v heads: copied. KV: the
// pool's element type, T (copied) or __nv_fp8_e4m3 (each T value quantized as ReshapeAndCache
// does: FromFloat(float(x) / scale), k_scale / v_scale per kv head when per_head_scale; unused for
// a T pool). kPer: elements per lane (head_dim <= 32 * kPer); the skipped i >= kPer terms of
// QkHeadRmsNorm's loop add fmaf(0, 0, s) == s exactly.
template <typename T, typename KV, int kPer>
__global__ void __launch_bounds__(kWarps * 32)
    QkNormRopeQkvToCacheKernel(const T* __restrict__ qkv, int64_t qkv_stride,
                               const int64_t* __restrict__ positions,
                               const int64_t* __restrict__ slot_mapping, int64_t num_pairs,
                               const float* __restrict__ inv_freq, int head_dim, int num_q_heads,
                               int num_kv_heads, const T* __restrict__ q_norm,
                               const T* __restrict__ k_norm, float eps, T* __restrict__ q_out,
                               KV* __restrict__ pool, int64_t num_slots, int block_size,
                               int64_t layer_tile_offset, int64_t block_stride, int64_t kv_stride,
                               const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                               bool per_head_scale) {
  constexpr bool kFp8 = !std::is_same_v<T, KV>;
  __shared__ alignas(16) unsigned char staged_bytes[kWarps * 32 * kPer * sizeof(T)];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t pair = int64_t{blockIdx.x} * kWarps + warp;
  internal::WaitForPrecedingGrid();  // PDL: as RopeQkvToCacheKernel
  internal::AllowDependentLaunch();
  if (pair >= num_pairs) return;
  const int heads = num_q_heads + 2 * num_kv_heads;
  const int64_t t = pair / heads;
  const int h = static_cast<int>(pair % heads);
  const T* src = qkv + t * qkv_stride + int64_t{h} * head_dim;
  T* dst = nullptr;       // q_out's row, or a T pool's k row
  KV* fp8_dst = nullptr;  // an fp8 pool's k row (kFp8 only)
  float k_head_scale = 1.0f;
  if (h < num_q_heads) {
    dst = q_out + (t * num_q_heads + h) * head_dim;
  } else {
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) return;  // warp-uniform
    const int kv = h < num_q_heads + num_kv_heads ? 0 : 1;
    const int kv_head = h - num_q_heads - kv * num_kv_heads;
    KV* pool_row = pool + (slot / block_size) * block_stride + layer_tile_offset + kv * kv_stride +
                   ((slot % block_size) * num_kv_heads + kv_head) * int64_t{head_dim};
    const int scale_head = per_head_scale ? kv_head : 0;
    if (kv == 1) {
      for (int i = lane * 8; i < head_dim; i += 32 * 8) {
        if constexpr (kFp8) {
          const auto x = *reinterpret_cast<const Vec<T, 8>*>(src + i);
          const float scale = v_scale[scale_head];
          Vec<KV, 8> q;
#pragma unroll
          for (int j = 0; j < 8; ++j) q.v[j] = FromFloat<KV>(ToFloat(x.v[j]) / scale);
          *reinterpret_cast<Vec<KV, 8>*>(pool_row + i) = q;
        } else {
          *reinterpret_cast<Vec<T, 8>*>(pool_row + i) =
              *reinterpret_cast<const Vec<T, 8>*>(src + i);
        }
      }
      return;
    }
    if constexpr (kFp8) {
      fp8_dst = pool_row;
      k_head_scale = k_scale[scale_head];
    } else {
      dst = pool_row;
    }
  }
  const T* w = h < num_q_heads ? q_norm : k_norm;
  float v[kPer];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    v[i] = d < head_dim ? ToFloat(src[d]) : 0.0f;
    sum_sq = fmaf(v[i], v[i], sum_sq);
  }
  for (int off = 16; off > 0; off >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, off);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(head_dim) + eps);
  T* row = reinterpret_cast<T*>(staged_bytes) + warp * (32 * kPer);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) row[d] = FromFloat<T>((v[i] * inv_rms) * ToFloat(w[d]));
  }
  __syncwarp();
  const float pos = static_cast<float>(positions[t]);
  const int half = head_dim / 2;
  for (int i = lane; i < half; i += 32) {
    const float x1 = ToFloat(row[i]), x2 = ToFloat(row[i + half]);
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    if (kFp8 && dst == nullptr) {  // warp-uniform: a k head of an fp8 pool
      const T y1 = FromFloat<T>(x1 * c + (-x2) * s), y2 = FromFloat<T>(x2 * c + x1 * s);
      fp8_dst[i] = FromFloat<KV>(ToFloat(y1) / k_head_scale);
      fp8_dst[i + half] = FromFloat<KV>(ToFloat(y2) / k_head_scale);
      continue;
    }
    dst[i] = FromFloat<T>(x1 * c + (-x2) * s);
    dst[i + half] = FromFloat<T>(x2 * c + x1 * s);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
absl::Status QkNormRopeQkvToCache(const T* qkv, int64_t qkv_stride, const int64_t* positions,
                                  const int64_t* slot_mapping, int64_t num_tokens,
                                  const float* inv_freq, int64_t num_q_heads, const T* q_norm,
                                  const T* k_norm, float eps, T* q_out, const DeviceKvCache& cache,
                                  int64_t layer, cudaStream_t stream, bool pdl) {
  auto invalid = [](const auto&... args) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::QkNormRopeQkvToCache: ", args...));
  };
  constexpr KvDtype kOwn = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  RETURN_IF_ERROR(rope_internal::ValidateRopeQkvShape("QkNormRopeQkvToCache", cache, kOwn, layer,
                                                      num_tokens, num_q_heads, qkv_stride,
                                                      kMaxHeadDim));
  const KvCacheLayout& l = cache.layout;
  const int64_t D = l.head_dim;
  if (num_tokens == 0) return absl::OkStatus();
  if (qkv == nullptr || positions == nullptr || slot_mapping == nullptr || inv_freq == nullptr ||
      q_out == nullptr || q_norm == nullptr || k_norm == nullptr || !Aligned16(qkv) ||
      !Aligned16(q_out)) {
    return invalid("null or unaligned pointers");
  }
  const int64_t pairs = num_tokens * (num_q_heads + 2 * l.num_kv_heads);
  const int64_t blocks = (pairs + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return invalid(num_tokens, " tokens: too many");
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32),
                                         stream, pdl);
  auto launch = [&](auto* pool) {
    using KV = std::remove_pointer_t<decltype(pool)>;
    const auto kernel =
        D <= 128 ? QkNormRopeQkvToCacheKernel<T, KV, 4> : QkNormRopeQkvToCacheKernel<T, KV, 32>;
    return cudaLaunchKernelEx(config.get(), kernel, qkv, qkv_stride, positions, slot_mapping, pairs,
                              inv_freq, static_cast<int>(D), static_cast<int>(num_q_heads),
                              static_cast<int>(l.num_kv_heads), q_norm, k_norm, eps, q_out, pool,
                              l.NumSlots(), static_cast<int>(l.block_size),
                              l.TileOffset(0, layer, 0), l.BlockElems(), l.TileElems(),
                              cache.k_scale, cache.v_scale, cache.per_head_scale);
  };
  CUDA_RETURN_IF_ERROR(cache.dtype == KvDtype::kFp8E4m3
                           ? launch(static_cast<__nv_fp8_e4m3*>(cache.data))
                           : launch(static_cast<T*>(cache.data)));
  return absl::OkStatus();
}

template absl::Status QkNormRopeQkvToCache<__nv_bfloat16>(
    const __nv_bfloat16*, int64_t, const int64_t*, const int64_t*, int64_t, const float*, int64_t,
    const __nv_bfloat16*, const __nv_bfloat16*, float, __nv_bfloat16*, const DeviceKvCache&,
    int64_t, cudaStream_t, bool);
template absl::Status QkNormRopeQkvToCache<__half>(const __half*, int64_t, const int64_t*,
                                                   const int64_t*, int64_t, const float*, int64_t,
                                                   const __half*, const __half*, float, __half*,
                                                   const DeviceKvCache&, int64_t, cudaStream_t,
                                                   bool);

}  // namespace tandem::kernels::cuda
