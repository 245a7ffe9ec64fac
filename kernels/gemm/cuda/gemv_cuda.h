// Small-batch linear layer (decode): out[m, n] = a[m, k] . w[n, k] (+ bias[n]) for m <= 8, the
// shapes where a GEMM library's tensor-core tiles idle and the cost is reading w once. One warp
// per output row streams the row with 16-byte loads (several in flight per lane), keeps the m
// activations' dot products in fp32 registers and reduces them with shuffles.
//
// Measured motivation (H200, Llama-3-8B shapes, m = 1): cuBLASLt read the qkv and o_proj weights
// at 58-70% of 4.3 TB/s.
//
// Programmatic dependent launch (PDL, sm_90): with programmatic_launch = true the kernel is
// launched with cudaLaunchAttributeProgrammaticStreamSerialization, so its CTAs may be scheduled
// before the previous kernel on the stream has finished. Every warp executes griddepcontrol.wait
// (cudaGridDependencySynchronize: returns once the preceding grid has COMPLETED and its memory
// is visible) before it reads a or bias or writes out, so correctness never depends on where or
// whether the predecessor triggers; the kernel itself triggers
// (griddepcontrol.launch_dependents) right after its wait, so a PDL-launched successor can be
// scheduled during this kernel's last wave. Without the attribute both instructions are no-ops:
// one kernel serves both modes. Works eagerly and under CUDA graph capture (the dependency
// becomes a programmatic graph edge). Prefetching weights into L2 before the wait was measured
// and dropped (H200, Llama-3-8B batch-1 decode step 4.60 -> 4.98 ms with it).
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_KERNELS_GEMM_CUDA_GEMV_CUDA_H_
#define TANDEM_KERNELS_GEMM_CUDA_GEMV_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kGemvMaxM = 8;

// True when SmallMLinear takes these arguments: 1 <= m <= kGemvMaxM, n >= 1, k a positive
// multiple of 8, a / w 16-byte aligned (rows are then 16-byte aligned too).
bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k);

// a: [m, k] of T; w: [n, k] of T (nn.Linear layout); bias: [n] of T or null; out: [m, n] of TOut
// (T or float), not overlapping the inputs. fp32 accumulation, one rounding to TOut (after the
// bias add). T is __nv_bfloat16 or __half. INVALID_ARGUMENT (nothing launched) unless
// SmallMLinearSupported and out is non-null. programmatic_launch: see the PDL note above.
template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream, bool programmatic_launch = false);

// The MLP's gate_up product with SiLU-and-mul folded into its epilogue (no [m, 2 * inter]
// intermediate, no separate activation kernel):
//   g = round_T(a[i] . w[j] + bias[j]),  u = round_T(a[i] . w[inter + j] + bias[inter + j]),
//   out[i, j] = round_T(g / (1 + exp(-g)) * u)
// a: [m, k]; w: [2 * inter, k] (gate rows first, then up rows: the fused gate_up_proj);
// bias: [2 * inter] or null; out: [m, inter], not overlapping the inputs. Bit-identical to
// SmallMLinear<T, T> into a [m, 2 * inter] buffer followed by SiluAndMul<T> (layers_cuda.h):
// each dot product runs in the same lane order and is rounded to T before the activation.
// One warp per output column j streams the two weight rows j and inter + j, so the activation
// costs inter exp() per token instead of being recomputed by every consumer. INVALID_ARGUMENT
// unless SmallMLinearSupported(a, w, m, 2 * inter, k) and out is non-null.
template <typename T>
absl::Status SmallMLinearSiluMul(const T* a, const T* w, const T* bias, int64_t m, int64_t inter,
                                 int64_t k, T* out, cudaStream_t stream,
                                 bool programmatic_launch = false);

// The residual add + RMSNorm of a decoder layer folded into the batch-1 GEMVs around it (one
// GPU: no all-reduce between them), removing the norm kernels from the step:
//
// SmallMLinearNormIn: out = RmsNorm(x) . w^T (+ bias), RmsNorm(x)[i, :] = round_T((x[i, :] *
// rsqrt(mean(x[i, :]^2) + eps)) * norm_weight). x: [m, k], the residual stream; norm_weight: [k].
// Every CTA computes the rows' rms itself (it reads all of x anyway) and stages the normalised
// rows in shared memory ((m + 1) * k * 2 + 32 bytes: SmallMLinearNormInSupported), with
// RmsNorm<T>'s arithmetic (kernels/layers/cuda/layers_cuda.h: the same thread layout, sum order and
// roundings), so out is bit-identical to RmsNorm<T> into a buffer followed by SmallMLinear<T, T>.
// SmallMLinearNormInSiluMul: the same for SmallMLinearSiluMul (bit-identical to RmsNorm<T> +
// SmallMLinearSiluMul<T>).
// SmallMLinearAddTo: residual = round_T(residual + round_T(a . w^T (+ bias))), in place: the
// product rounded as SmallMLinear<T, T> stores it, then added as FusedAddRmsNorm updates the
// residual (bit-identical to SmallMLinear<T, T> into `x` + FusedAddRmsNorm's residual update).
// residual: [m, n], not overlapping a, w or bias.
// T is __nv_bfloat16 or __half. INVALID_ARGUMENT (nothing launched) outside the Supported
// functions or for a null out / residual. programmatic_launch: see the PDL note above.
inline constexpr int64_t kGemvNormInMaxSmemBytes = 48 * 1024;
bool SmallMLinearNormInSupported(const void* x, const void* norm_weight, const void* w, int64_t m,
                                 int64_t n, int64_t k);
template <typename T>
absl::Status SmallMLinearNormIn(const T* x, const T* norm_weight, float eps, const T* w,
                                const T* bias, int64_t m, int64_t n, int64_t k, T* out,
                                cudaStream_t stream, bool programmatic_launch = false);
template <typename T>
absl::Status SmallMLinearNormInSiluMul(const T* x, const T* norm_weight, float eps, const T* w,
                                       const T* bias, int64_t m, int64_t inter, int64_t k, T* out,
                                       cudaStream_t stream, bool programmatic_launch = false);
template <typename T>
absl::Status SmallMLinearAddTo(const T* a, const T* w, const T* bias, int64_t m, int64_t n,
                               int64_t k, T* residual, cudaStream_t stream,
                               bool programmatic_launch = false);

// The qkv product of a batch-1 step with the input RMSNorm in its prologue (as
// SmallMLinearNormIn) and RoPE + the KV-pool write in its epilogue, one kernel instead of
// SmallMLinearNormIn into a qkv buffer + RopeQkvToCache (kernels/attention/cuda/rope_cache_cuda.h).
// w: [width, k], width = (num_q_heads + 2 * num_kv_heads) * head_dim (q, k, v rows); bias: [width]
// or null. One warp per (head, i < head_dim / 2) streams rows i and i + head_dim / 2 of the head
// as the kNormIn kernel streams a row (the products bit-identical to SmallMLinearNormIn's), rounds
// them to T as the qkv buffer would, then rotates q and k with RopeQkvToCache's fp32 arithmetic
// (sincosf of float(position) * inv_freq[i]) or copies v: q to q_out dense, k / v into the
// token's pool slot (skipped for slots < 0 or >= num_slots), at RopeQkvToCache's pool addresses
// (the caller passes the pool geometry: KvCacheLayout's TileOffset(0, layer, 0), BlockElems(),
// TileElems(); the pool must hold T). No qkv buffer is written. INVALID_ARGUMENT (nothing
// launched) unless SmallMLinearNormInRopeKvSupported.
struct GemvRopeKv {
  const int64_t* positions = nullptr;     // [m] (device)
  const int64_t* slot_mapping = nullptr;  // [m] (device)
  const float* inv_freq = nullptr;        // [head_dim / 2] (device)
  int head_dim = 0, num_q_heads = 0, num_kv_heads = 0;
  void* q_out = nullptr;  // [m, num_q_heads, head_dim] of T
  // The KV pool: of T, or (k_scale and v_scale non-null: device fp32 [1] each) of fp8 e4m3 codes
  // with one scale per tensor, code = e4m3(float(T value) / scale) as ReshapeAndCache and
  // RopeQkvToCache store them (kernels/attention/cuda/kv_cache_cuda.h).
  void* pool = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t num_slots = 0, block_size = 0, layer_tile_offset = 0, block_stride = 0, kv_stride = 0;
};
bool SmallMLinearNormInRopeKvSupported(const void* x, const void* norm_weight, const void* w,
                                       int64_t m, int64_t k, const GemvRopeKv& rope);
template <typename T>
absl::Status SmallMLinearNormInRopeKv(const T* x, const T* norm_weight, float eps, const T* w,
                                      const T* bias, int64_t m, int64_t k, const GemvRopeKv& rope,
                                      cudaStream_t stream, bool programmatic_launch = false);

#define TANDEM_GEMV_CUDA_EXTERN(T, TOut)                                                    \
  extern template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t, \
                                                     int64_t, int64_t, TOut*, cudaStream_t, bool);
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_EXTERN(__half, __half)
TANDEM_GEMV_CUDA_EXTERN(__half, float)
#undef TANDEM_GEMV_CUDA_EXTERN
extern template absl::Status SmallMLinearSiluMul<__nv_bfloat16>(const __nv_bfloat16*,
                                                                const __nv_bfloat16*,
                                                                const __nv_bfloat16*, int64_t,
                                                                int64_t, int64_t, __nv_bfloat16*,
                                                                cudaStream_t, bool);
extern template absl::Status SmallMLinearSiluMul<__half>(const __half*, const __half*,
                                                         const __half*, int64_t, int64_t, int64_t,
                                                         __half*, cudaStream_t, bool);
#define TANDEM_GEMV_FOLD_EXTERN(T)                                                               \
  extern template absl::Status SmallMLinearNormIn<T>(const T*, const T*, float, const T*,        \
                                                     const T*, int64_t, int64_t, int64_t, T*,    \
                                                     cudaStream_t, bool);                        \
  extern template absl::Status SmallMLinearNormInSiluMul<T>(const T*, const T*, float, const T*, \
                                                            const T*, int64_t, int64_t, int64_t, \
                                                            T*, cudaStream_t, bool);             \
  extern template absl::Status SmallMLinearAddTo<T>(const T*, const T*, const T*, int64_t,       \
                                                    int64_t, int64_t, T*, cudaStream_t, bool);   \
  extern template absl::Status SmallMLinearNormInRopeKv<T>(const T*, const T*, float, const T*,  \
                                                           const T*, int64_t, int64_t,           \
                                                           const GemvRopeKv&, cudaStream_t, bool);
TANDEM_GEMV_FOLD_EXTERN(__nv_bfloat16)
TANDEM_GEMV_FOLD_EXTERN(__half)
#undef TANDEM_GEMV_FOLD_EXTERN

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_GEMM_CUDA_GEMV_CUDA_H_
