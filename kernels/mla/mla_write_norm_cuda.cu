// MlaWriteLatentNormed (mla_cuda.h): kv_a_layernorm fused into the latent write. One block of 256
// threads per token runs kernels/layers/cuda's RmsNormKernel<T, false, 1> arithmetic on the c_kv
// row (rows of at most 8 x 256 elements: that kernel's one-vector-per-thread instantiation): each
// thread's 8 elements from threadIdx.x * 8 squared into an fp32 fmaf chain, BlockSum<256> (its
// fixed order), rsqrtf(sum / float(L) + eps), (x * inv_rms) * w rounded once to T. The normalized
// row goes straight to the pool slot, k_pe copied after it, as MlaWriteLatent writes them; with
// an MlaLatentRope, k_pe rotated on the way as mla_absorb_cuda.cu's MlaRopeKernel rotates it (one
// thread per pair, the same expressions). Bit-identical to RmsNorm(c_kv) (+ MlaRope(k_pe)) then
// MlaWriteLatent (mla_write_norm_cuda_test).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kVec = 8;
constexpr int kThreads = 256;  // RmsNormKernel's kNormThreads: the same BlockSum order

// MlaRopeKernel's rotation of pair p of one k_pe row (src) into dst: the angle the fp32 product,
// as in transformers; cos / sin in fp64 rounded to fp32, times the factor; x rounded once to T.
template <typename T>
__device__ __forceinline__ void RotatePair(const int64_t* positions, int64_t t,
                                           const float* inv_freq, int p, int half, float factor,
                                           bool interleave, const T* src, T* dst) {
  const float angle = static_cast<float>(positions[t]) * inv_freq[p];
  double sn, cs;
  sincos(static_cast<double>(angle), &sn, &cs);
  const float c = static_cast<float>(cs) * factor, s = static_cast<float>(sn) * factor;
  const int a = interleave ? 2 * p : p, b = interleave ? 2 * p + 1 : p + half;
  const float x1 = internal::ToFloat(src[a]), x2 = internal::ToFloat(src[b]);
  dst[a] = internal::FromFloat<T>(x1 * c - x2 * s);
  dst[b] = internal::FromFloat<T>(x2 * c + x1 * s);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    WriteLatentNormedKernel(const T* c_kv, int64_t c_kv_stride, const T* __restrict__ weight,
                            int64_t lora, float eps, const T* k_pe, int64_t k_pe_stride,
                            const int64_t* slots, int rope_dim, int dim, int block_size,
                            int64_t block_elems, int64_t layer_offset, T* pool,
                            MlaLatentRope rope) {
  __shared__ float warp_sums[kThreads / 32];
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // the whole block: no thread reaches BlockSum's barrier
  T* dst = pool + (slot / block_size) * block_elems + layer_offset + (slot % block_size) * dim;
  const int64_t i = int64_t{threadIdx.x} * kVec;
  float a[kVec];
  float sum_sq = 0.0f;
  if (i < lora) {
    internal::VecToFloat(
        *reinterpret_cast<const internal::Vec<T, kVec>*>(c_kv + t * c_kv_stride + i), a);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq = fmaf(a[j], a[j], sum_sq);
  }
  const float inv_rms =
      rsqrtf(BlockSum<kThreads>(sum_sq, warp_sums) / static_cast<float>(lora) + eps);
  if (i < lora) {
    float w[kVec];
    internal::VecToFloat(*reinterpret_cast<const internal::Vec<T, kVec>*>(weight + i), w);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dst[i + j] = internal::FromFloat<T>((a[j] * inv_rms) * w[j]);
  }
  const T* pe = k_pe + t * k_pe_stride;
  if (rope.positions != nullptr) {
    const int half = rope_dim / 2;
    for (int p = threadIdx.x; p < half; p += kThreads) {
      RotatePair<T>(rope.positions, t, rope.inv_freq, p, half, rope.attention_factor,
                    rope.interleave, pe, dst + lora);
    }
    return;
  }
  for (int c = threadIdx.x; c < rope_dim; c += kThreads) dst[lora + c] = pe[c];
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
absl::Status MlaWriteLatentNormed(const T* c_kv, int64_t c_kv_stride, const T* norm_weight,
                                  float eps, const T* k_pe, int64_t k_pe_stride,
                                  const int64_t* slot_mapping, int64_t num_tokens,
                                  const MlaDims& dims, const DeviceKvCache& cache, int64_t layer,
                                  cudaStream_t stream, const MlaLatentRope* rope) {
  RETURN_IF_ERROR(dims.Validate());
  RETURN_IF_ERROR(mla_internal::CheckLatentPool<T>(cache, dims, layer, "MlaWriteLatentNormed"));
  const int64_t L = dims.kv_lora_rank;
  if (!MlaWriteLatentNormedSupported(dims) || num_tokens < 0 || c_kv_stride < L ||
      c_kv_stride % kVec != 0 || k_pe_stride < dims.qk_rope_head_dim || !(eps >= 0) ||
      num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaWriteLatentNormed: kv_lora_rank ", L, " (a multiple of 8, at most ",
                     kMlaWriteNormMaxLora, "), ", num_tokens, " tokens, strides ", c_kv_stride,
                     ", ", k_pe_stride, ", eps ", eps));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (c_kv == nullptr || norm_weight == nullptr || k_pe == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("MlaWriteLatentNormed: null pointer");
  }
  if (!Aligned16(c_kv) || !Aligned16(norm_weight)) {
    return absl::InvalidArgumentError("MlaWriteLatentNormed: c_kv and the weight 16-byte aligned");
  }
  if (rope != nullptr && (rope->positions == nullptr || rope->inv_freq == nullptr)) {
    return absl::InvalidArgumentError("MlaWriteLatentNormed: RoPE without positions / inv_freq");
  }
  WriteLatentNormedKernel<T><<<static_cast<unsigned>(num_tokens), kThreads, 0, stream>>>(
      c_kv, c_kv_stride, norm_weight, L, eps, k_pe, k_pe_stride, slot_mapping,
      static_cast<int>(dims.qk_rope_head_dim), static_cast<int>(dims.LatentDim()),
      static_cast<int>(cache.layout.block_size), cache.layout.BlockElems(),
      cache.layout.TileOffset(0, layer, 0), static_cast<T*>(cache.data),
      rope != nullptr ? *rope : MlaLatentRope{});
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

#define TANDEM_MLA_WRITE_NORMED(T)                                                    \
  template absl::Status MlaWriteLatentNormed<T>(                                      \
      const T*, int64_t, const T*, float, const T*, int64_t, const int64_t*, int64_t, \
      const MlaDims&, const DeviceKvCache&, int64_t, cudaStream_t, const MlaLatentRope*);
TANDEM_MLA_WRITE_NORMED(__nv_bfloat16)
TANDEM_MLA_WRITE_NORMED(__half)
#undef TANDEM_MLA_WRITE_NORMED

}  // namespace tandem::kernels::cuda
