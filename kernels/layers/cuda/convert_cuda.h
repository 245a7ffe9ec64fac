// Small element-wise and copy ops around the GEMMs: fp32 <-> bf16/fp16 conversion, row gather
// (e.g. the last token of each request before the lm_head) and a broadcast bias add.
//
// Every op is asynchronous on `stream`, graph-capturable (no allocation, no synchronization),
// reads and writes only the tensors named, and returns INVALID_ARGUMENT (nothing launched) for
// negative sizes or null pointers where data is needed; empty work returns OK without a launch.
// No alignment is required: 16-byte vector paths are taken where pointers and rows allow.
#ifndef TANDEM_KERNELS_LAYERS_CUDA_CONVERT_CUDA_H_
#define TANDEM_KERNELS_LAYERS_CUDA_CONVERT_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// out[i] = round_to_nearest_even_T(in[i]); in: [n] fp32, out: [n] T (__nv_bfloat16 or __half).
// IEEE semantics: overflow rounds to +-inf, NaN stays NaN, subnormals are kept (no flush).
template <typename T>
absl::Status ConvertFromF32(const float* in, int64_t n, T* out, cudaStream_t stream);

// out[i] = in[i] widened to fp32 (exact); in: [n] T (__nv_bfloat16 or __half), out: [n] fp32
// (e.g. bf16 logits of an FP8 lm_head into the fp32 logits the samplers read).
template <typename T>
absl::Status ConvertToF32(const T* in, int64_t n, float* out, cudaStream_t stream);

// out[i, :] = in[rows[i], :]. in: [*, row_elems]; rows: [num_rows] int32 (device); out:
// [num_rows, row_elems], not overlapping in. REQUIRES: every rows[i] indexes a row of in (the
// ids live on the device, so they are not checked); a negative id writes a zero row (padding).
// T is float, __nv_bfloat16 or __half.
template <typename T>
absl::Status GatherRows(const T* in, int64_t row_elems, const int32_t* rows, int64_t num_rows,
                        T* out, cudaStream_t stream);

// x[r, c] += bias[c] in fp32, rounded once to T. x: [rows, cols]; bias: [cols].
// (T, TBias): (bf16, bf16), (fp16, fp16), (float, float), and (float, bf16) / (float, fp16) for
// fp32 logits with a bf16/fp16 bias.
template <typename T, typename TBias = T>
absl::Status AddBias(T* x, const TBias* bias, int64_t rows, int64_t cols, cudaStream_t stream);

#define TANDEM_CONVERT_CUDA_EXTERN(T)                                                        \
  extern template absl::Status GatherRows<T>(const T*, int64_t, const int32_t*, int64_t, T*, \
                                             cudaStream_t);                                  \
  extern template absl::Status AddBias<T, T>(T*, const T*, int64_t, int64_t, cudaStream_t);
TANDEM_CONVERT_CUDA_EXTERN(float)
TANDEM_CONVERT_CUDA_EXTERN(__nv_bfloat16)
TANDEM_CONVERT_CUDA_EXTERN(__half)
#undef TANDEM_CONVERT_CUDA_EXTERN
extern template absl::Status ConvertFromF32<__nv_bfloat16>(const float*, int64_t, __nv_bfloat16*,
                                                           cudaStream_t);
extern template absl::Status ConvertFromF32<__half>(const float*, int64_t, __half*, cudaStream_t);
extern template absl::Status ConvertToF32<__nv_bfloat16>(const __nv_bfloat16*, int64_t, float*,
                                                         cudaStream_t);
extern template absl::Status ConvertToF32<__half>(const __half*, int64_t, float*, cudaStream_t);
extern template absl::Status AddBias<float, __nv_bfloat16>(float*, const __nv_bfloat16*, int64_t,
                                                           int64_t, cudaStream_t);
extern template absl::Status AddBias<float, __half>(float*, const __half*, int64_t, int64_t,
                                                    cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_LAYERS_CUDA_CONVERT_CUDA_H_
