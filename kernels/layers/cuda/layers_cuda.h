// CUDA twins of the per-token layer ops in kernels/layers/ (norm.h, rope.h, activation.h,
// embedding.h) for bf16/fp16 activations with fp32 math.
//
// Every op is asynchronous on `stream`, reads and writes only the tensors named, and returns
// INVALID_ARGUMENT (nothing launched) for negative sizes, null pointers where data is needed,
// or rows that are not 16-byte aligned (pointers and row lengths must allow 8-element vectors:
// hidden, inter and head_dim / 2 multiples of 8). T is __nv_bfloat16 or __half.
//
// programmatic_launch (the norms): launch with programmatic stream serialization (PDL, sm_90),
// so the kernel may start while the previous kernel on the stream still runs; it waits
// (griddepcontrol.wait: the preceding grid complete, its memory visible) before touching any
// tensor, then lets its own PDL successor launch. Same semantics as kernels/gemm/cuda/gemv_cuda.h;
// false: an ordinary launch (the wait is then a no-op).
#ifndef TANDEM_KERNELS_LAYERS_CUDA_LAYERS_CUDA_H_
#define TANDEM_KERNELS_LAYERS_CUDA_LAYERS_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// out = (x * rsqrt(mean(x^2) + eps)) * weight per token, fp32 math, rounded once to T.
// x, out: [num_tokens, hidden]; weight: [hidden]. out may alias x exactly.
template <typename T>
absl::Status RmsNorm(const T* x, const T* weight, int64_t num_tokens, int64_t hidden, float eps,
                     T* out, cudaStream_t stream, bool programmatic_launch = false);

// vLLM's fused_add_rms_norm, in place: residual = round_T(residual + x); x = RmsNorm(residual).
// x, residual: [num_tokens, hidden] (non-overlapping); weight: [hidden].
template <typename T>
absl::Status FusedAddRmsNorm(T* x, T* residual, const T* weight, int64_t num_tokens, int64_t hidden,
                             float eps, cudaStream_t stream, bool programmatic_launch = false);

// Rotate-half RoPE in place on q and k (rotary_dim == head_dim), as cpu::ApplyRope: the angle is
// the fp32 product float(positions[t]) * inv_freq[i]; cos/sin are accurate fp32 (sincosf).
// positions: [num_tokens] int64 (device); inv_freq: [head_dim / 2] fp32 (device; from
// ComputeRopeInvFreq); q: [num_tokens, num_q_heads, head_dim]; k: [num_tokens, num_kv_heads,
// head_dim]. Rows may be strided (q_token_stride / k_token_stride elements between tokens,
// e.g. views into a fused qkv output); -1 means dense.
template <typename T>
absl::Status ApplyRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                       int64_t head_dim, T* q, int64_t num_q_heads, T* k, int64_t num_kv_heads,
                       cudaStream_t stream, int64_t q_token_stride = -1,
                       int64_t k_token_stride = -1);

// out = silu(gate) * up in fp32, silu(x) = x / (1 + exp(-x)).
// gate_up: [num_tokens, 2 * inter] (gate first); out: [num_tokens, inter], not overlapping.
template <typename T>
absl::Status SiluAndMul(const T* gate_up, int64_t num_tokens, int64_t inter, T* out,
                        cudaStream_t stream);

// out[t, :] = table[ids[t], :]. ids: [num_tokens] (device); table: [vocab, hidden];
// out: [num_tokens, hidden]. ids live on the device, so they are not checked on the host (the
// CPU op's INVALID_ARGUMENT): an id outside [0, vocab) gives a zero row, and when
// bad_id_count is non-null (device int32, caller-zeroed) the kernel atomically adds the number
// of such ids to it, for a deferred check.
template <typename T>
absl::Status Embedding(const int32_t* ids, int64_t num_tokens, const T* table, int64_t vocab,
                       int64_t hidden, T* out, cudaStream_t stream,
                       int32_t* bad_id_count = nullptr);

// The vocab-parallel lookup of one tensor-parallel rank (the CPU op's twin,
// kernels/layers/embedding.h): `table` holds vocabulary rows [vocab_begin, vocab_begin + rows);
// out[t, :] is ids[t]'s row when it falls there, else zeros.
template <typename T>
absl::Status VocabShardEmbedding(const int32_t* ids, int64_t num_tokens, const T* table,
                                 int64_t vocab_begin, int64_t rows, int64_t hidden, T* out,
                                 cudaStream_t stream);

#define TANDEM_LAYERS_CUDA_EXTERN(T)                                                               \
  extern template absl::Status RmsNorm<T>(const T*, const T*, int64_t, int64_t, float, T*,         \
                                          cudaStream_t, bool);                                     \
  extern template absl::Status FusedAddRmsNorm<T>(T*, T*, const T*, int64_t, int64_t, float,       \
                                                  cudaStream_t, bool);                             \
  extern template absl::Status ApplyRope<T>(const int64_t*, int64_t, const float*, int64_t, T*,    \
                                            int64_t, T*, int64_t, cudaStream_t, int64_t, int64_t); \
  extern template absl::Status SiluAndMul<T>(const T*, int64_t, int64_t, T*, cudaStream_t);        \
  extern template absl::Status Embedding<T>(const int32_t*, int64_t, const T*, int64_t, int64_t,   \
                                            T*, cudaStream_t, int32_t*);                           \
  extern template absl::Status VocabShardEmbedding<T>(const int32_t*, int64_t, const T*, int64_t,  \
                                                      int64_t, int64_t, T*, cudaStream_t);
TANDEM_LAYERS_CUDA_EXTERN(__nv_bfloat16)
TANDEM_LAYERS_CUDA_EXTERN(__half)
#undef TANDEM_LAYERS_CUDA_EXTERN

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_LAYERS_CUDA_LAYERS_CUDA_H_
