// FP8 linear layers on the GPU (issue 38 item 4), the CUDA twins of fp8.h / fp8_linear.h:
//   * QuantizeActivations: bf16 activations -> e4m3 codes + fp32 scales (static per-tensor,
//     dynamic per-token, dynamic 1 x 128 groups), the same codes as the CPU's (amax / 448 in
//     fp32, an IEEE division, round to nearest even with saturation);
//   * Fp8Gemv (decode, m <= kFp8GemvMaxM): one warp per output row streams the row's e4m3 bytes
//     with 16-byte loads, the weight's per-row block scales (our in-memory form: block_rows 1,
//     block_cols 128 or k) and the activations' scales fused: each 16-column chunk's dot product
//     is scaled once (weight scale x activation scale) and accumulated in fp32.
// Status: built, tested against cpu::Fp8Linear by fp8_cuda_test (a GPU test), but NOT yet run on
// a GPU in this tree (README.md).
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_KERNELS_FP8_FP8_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kFp8GemvMaxM = 16;

// x: [m, k] bf16; codes: [m, k] e4m3 bytes; scales: NumActivationScales(scheme, m, k) floats
// (kStaticTensor: scales[0] = static_scale is written). INVALID_ARGUMENT for kNone, m or k < 1,
// null pointers, or a non-positive static scale. programmatic_launch: launched with PDL (the
// kernel waits for the preceding grid before reading x), as kernels/gemm/cuda/gemv_cuda.h's.
// Vectorized (16-byte loads, 8-byte code stores) where k % 8 == 0, x is 16-byte and codes 8-byte
// aligned: a block per row for per-token / static scales, a half-warp per 128-column group for
// kDynamicGroup128 (TANDEM_FP8_QUANT_VEC_GROUPS=0: the scalar form, the same bits).
// group_major_ld > 0 (kDynamicGroup128 only, >= m): the scales go group-major, [groups, ld]
// (Fp8GroupScaleIndex: the block-scaled GEMM reads them so, no TransposeGroupScales); the same
// values.
absl::Status QuantizeActivations(const __nv_bfloat16* x, int64_t m, int64_t k,
                                 Fp8ActivationScheme scheme, float static_scale, uint8_t* codes,
                                 float* scales, cudaStream_t stream,
                                 bool programmatic_launch = false, int64_t group_major_ld = 0);
// The same from fp32 rows: what the CUDA model's device dummy FP8 weights use (rows quantized
// per row, kDynamicToken, or per 128 columns, kDynamicGroup128), as kernels::QuantizeWeight on
// the host.
absl::Status QuantizeActivations(const float* x, int64_t m, int64_t k, Fp8ActivationScheme scheme,
                                 float static_scale, uint8_t* codes, float* scales,
                                 cudaStream_t stream);

// Quantizes an fp32 weight w: [n, k] with one scale per 128 x 128 tile (DeepSeek's
// weight_block_size [128, 128]; tiles from w's first row and column, the last ones partial):
// codes [n, k] and the tile scales in our in-memory form, row_scales [n, ceil(k / 128)] (each row
// of a tile holding the tile's scale), the same codes and scales as kernels::QuantizeWeight with
// a {n, k, 128, 128} grid, expanded to rows. block_scales (null: not written): the tile scales
// in cuBLASLt's block layout, [ceil(n / 128), block_ld] with block_ld >= ceil(k / 128) (columns
// past it set to 1): kernels/fp8/fp8_gemm_cuda.h Block128WeightScales. What device dummy FP8
// weights of a 128 x 128-block config use. INVALID_ARGUMENT for n or k < 1, n past 65535 tiles,
// null codes / row_scales, or a block_ld too small.
absl::Status QuantizeWeightTiles128(const float* w, int64_t n, int64_t k, uint8_t* codes,
                                    float* row_scales, float* block_scales, int64_t block_ld,
                                    cudaStream_t stream);

// out[r, c] = e4m3(codes[r, c]) * scales[r * GridCols + c / block_cols] in fp32, rounded once to
// bf16: kernels::cpu::DequantizeFp8Weight on the device (per-row grids: block_rows 1).
// INVALID_ARGUMENT for another grid or null buffers.
absl::Status DequantizeWeight(const uint8_t* codes, const float* scales, const Fp8ScaleGrid& grid,
                              __nv_bfloat16* out, cudaStream_t stream);

// One FP8 weight on the device: codes [grid.rows, grid.cols], scales [grid.NumScales()] with
// grid.block_rows == 1 and grid.block_cols 128 or grid.cols.
struct Fp8DeviceWeight {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  Fp8ScaleGrid grid;
};

// The activations of one Fp8Gemv call: bf16 values (scheme kNone) or e4m3 codes with the scales
// QuantizeActivations wrote for `scheme`.
struct Fp8DeviceActivations {
  Fp8ActivationScheme scheme = Fp8ActivationScheme::kNone;
  const __nv_bfloat16* values = nullptr;  // [m, k], kNone
  const uint8_t* codes = nullptr;         // [m, k], other schemes
  const float* scales = nullptr;
};

// out[m, n] = a . w^T (+ bias[n]), fp32 accumulation, one rounding to TOut (bf16 or float).
// INVALID_ARGUMENT (nothing launched) unless 1 <= m <= kFp8GemvMaxM, k a positive multiple of
// 16, 16-byte aligned codes / values, block_rows 1, block_cols 128 or k, a 1x128-group scheme
// only with k-wide or 128 blocks, non-null pointers.
template <typename TOut>
absl::Status Fp8Gemv(const Fp8DeviceActivations& a, const Fp8DeviceWeight& w,
                     const __nv_bfloat16* bias, int64_t m, TOut* out, cudaStream_t stream);

// out[m, n] += bias[n] in fp32, rounded once to bf16 (the cuBLASLt FP8 GEMM's output has no
// bias epilogue here). INVALID_ARGUMENT for null pointers or n < 1.
absl::Status AddBias(__nv_bfloat16* out, const __nv_bfloat16* bias, int64_t m, int64_t n,
                     cudaStream_t stream);

// The scaling epilogue of an FP8 GEMM whose scales cuBLASLt cannot apply (per-token x
// per-channel on sm_90, where cuBLASLt has no outer-vector scale mode): out[i, j] =
// acc[i, j] * a_scales[i] * w_scales[j] (+ bias[j]) in fp32, rounded once to bf16. acc: [m, n]
// fp32 row-major (the unscaled fp32 product); a_scales [m]; w_scales [n]; bias [n] or null.
// INVALID_ARGUMENT for null buffers, m < 0 or n < 1; m == 0 launches nothing.
absl::Status ScaleFp8Accumulator(const float* acc, const float* a_scales, const float* w_scales,
                                 const __nv_bfloat16* bias, int64_t m, int64_t n,
                                 __nv_bfloat16* out, cudaStream_t stream);

extern template absl::Status Fp8Gemv<__nv_bfloat16>(const Fp8DeviceActivations&,
                                                    const Fp8DeviceWeight&, const __nv_bfloat16*,
                                                    int64_t, __nv_bfloat16*, cudaStream_t);
extern template absl::Status Fp8Gemv<float>(const Fp8DeviceActivations&, const Fp8DeviceWeight&,
                                            const __nv_bfloat16*, int64_t, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_CUDA_H_
