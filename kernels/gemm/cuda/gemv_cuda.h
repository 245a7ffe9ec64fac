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
// Warps in one block of the GEMV kernels (the most warps that can share a row, GemvTuning).
inline constexpr int kGemvWarpsPerBlock = 8;

// How the GEMV kernels stream a weight (same results up to fp32 summation order; the defaults are
// the kernel as it always ran, bit for bit).
struct GemvTuning {
  // Issue each warp's first weight loads (8 x 16 bytes a lane) before the PDL wait, so they
  // overlap the preceding kernel's tail (weights are never written by a preceding kernel).
  bool early_weight_loads = false;
  // Split-k inside a block: while fewer than this many warps would stream the n rows, 2, 4 or 8
  // warps share a row (each a 1 / split of its 16-byte chunks; the parts meet in shared memory),
  // as long as every lane keeps at least 2 chunks. 0: one warp a row.
  int64_t split_min_warps = 0;
};

// The warps that share one output row for n rows of k columns (1, 2, 4 or 8; GemvTuning).
inline int GemvSplit(int64_t n, int64_t k, const GemvTuning& tuning) {
  int split = 1;
  while (split < kGemvWarpsPerBlock && n * split < tuning.split_min_warps &&
         k / 8 >= int64_t{64} * split * 2) {
    split *= 2;
  }
  return split;
}

// True when SmallMLinear takes these arguments: 1 <= m <= kGemvMaxM, n >= 1, k a positive
// multiple of 8, a / w 16-byte aligned (rows are then 16-byte aligned too).
bool SmallMLinearSupported(const void* a, const void* w, int64_t m, int64_t n, int64_t k);

// a: [m, k] of T; w: [n, k] of T (nn.Linear layout); bias: [n] of T or null; out: [m, n] of TOut
// (T or float), not overlapping the inputs. fp32 accumulation, one rounding to TOut (after the
// bias add). T is __nv_bfloat16 or __half. INVALID_ARGUMENT (nothing launched) unless
// SmallMLinearSupported and out is non-null. programmatic_launch: see the PDL note above.
template <typename T, typename TOut>
absl::Status SmallMLinear(const T* a, const T* w, const T* bias, int64_t m, int64_t n, int64_t k,
                          TOut* out, cudaStream_t stream, bool programmatic_launch = false,
                          const GemvTuning& tuning = {});

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
                                 bool programmatic_launch = false, const GemvTuning& tuning = {});

// Where SmallMLinearRopeKv puts a token's q, k and v (the KV pool's geometry in elements, as
// kernels/attention/cuda RopeQkvToCache reads it from a DeviceKvCache: slot s of the layer lives
// at pool + (s / block_size) * block_stride + layer_tile_offset + kv * kv_stride + ((s %
// block_size) * num_kv_heads + kv_head) * head_dim, kv 0 for k and 1 for v).
struct GemvRopeKv {
  const int64_t* positions = nullptr;     // [m] (device)
  const int64_t* slot_mapping = nullptr;  // [m] (device); -1 or outside the pool: no k/v write
  const float* inv_freq = nullptr;        // [head_dim / 2] fp32 (device)
  int64_t head_dim = 0, num_q_heads = 0, num_kv_heads = 0;
  void* q_out = nullptr;  // [m, num_q_heads, head_dim] of T: rotated q
  void* pool = nullptr;   // the KV pool, of T
  int64_t num_slots = 0, block_size = 0, layer_tile_offset = 0, block_stride = 0, kv_stride = 0;
};

// The attention's qkv projection with RoPE and the KV write in its epilogue (no qkv intermediate,
// no separate RoPE kernel): the product a . w^T (+ bias) of w = [(Hq + 2 Hk) * D, k] (the fused
// q, k, v rows), each value rounded to T, then, per head, the pair (i, i + D / 2) rotated by
// position * inv_freq[i] (q and k; NeoX halves, fp32 sincosf) or copied (v); q to dst.q_out, k
// and v to their pool slots. The same arithmetic as SmallMLinear into a qkv buffer followed by
// RopeQkvToCache (kernels/attention/cuda/rope_cache_cuda.h) with the same tuning. One warp per
// pair streams its two weight rows. INVALID_ARGUMENT unless the arguments are usable (see the
// message).
template <typename T>
absl::Status SmallMLinearRopeKv(const T* a, const T* w, const T* bias, int64_t m, int64_t k,
                                const GemvRopeKv& dst, cudaStream_t stream,
                                bool programmatic_launch = false, const GemvTuning& tuning = {});

#define TANDEM_GEMV_CUDA_EXTERN(T, TOut)                                                          \
  extern template absl::Status SmallMLinear<T, TOut>(const T*, const T*, const T*, int64_t,       \
                                                     int64_t, int64_t, TOut*, cudaStream_t, bool, \
                                                     const GemvTuning&);
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, __nv_bfloat16)
TANDEM_GEMV_CUDA_EXTERN(__nv_bfloat16, float)
TANDEM_GEMV_CUDA_EXTERN(__half, __half)
TANDEM_GEMV_CUDA_EXTERN(__half, float)
#undef TANDEM_GEMV_CUDA_EXTERN
extern template absl::Status SmallMLinearSiluMul<__nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t, int64_t,
    __nv_bfloat16*, cudaStream_t, bool, const GemvTuning&);
extern template absl::Status SmallMLinearSiluMul<__half>(const __half*, const __half*,
                                                         const __half*, int64_t, int64_t, int64_t,
                                                         __half*, cudaStream_t, bool,
                                                         const GemvTuning&);

extern template absl::Status SmallMLinearRopeKv<__nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t,
    const GemvRopeKv&, cudaStream_t, bool, const GemvTuning&);
extern template absl::Status SmallMLinearRopeKv<__half>(const __half*, const __half*, const __half*,
                                                        int64_t, int64_t, const GemvRopeKv&,
                                                        cudaStream_t, bool, const GemvTuning&);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_GEMM_CUDA_GEMV_CUDA_H_
