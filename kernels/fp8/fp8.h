// FP8 (OCP e4m3fn) numbers and the quantization schemes FP8 checkpoints use, for the CPU
// reference and the tests of the CUDA kernels.
//
// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F / 0xFF are NaN; the
// largest finite value is 448, the smallest subnormal 2^-9. Conversion to e4m3 rounds to nearest
// even and saturates to +-448 (what every FP8 quantizer does: clamp, then cast; torch's cast
// alone would give NaN past 448).
//
// Weight scales are a grid of blocks (Fp8ScaleGrid): block_rows x block_cols elements of the
// [n, k] weight share one fp32 scale, w[r, c] = code[r, c] * scale[r / block_rows, c /
// block_cols]. Per-tensor is one block of [n, k], per-channel blocks of [1, k], DeepSeek's
// 128 x 128 blocks [128, 128]; the last block of a row or column may be partial.
//
// All functions are thread-safe (no shared state).
#ifndef TANDEM_KERNELS_FP8_FP8_H_
#define TANDEM_KERNELS_FP8_FP8_H_

#include <cstdint>

namespace tandem::kernels {

inline constexpr float kFp8E4m3Max = 448.0f;

// The value of an e4m3fn code (exact; NaN for 0x7F / 0xFF).
float Fp8E4m3ToFloat(uint8_t code);
// The e4m3fn code nearest to `x` (ties to even), saturated to +-448; NaN -> 0x7F.
uint8_t FloatToFp8E4m3(float x);

// Which elements of a weight share one scale (see the header comment).
struct Fp8ScaleGrid {
  int64_t rows = 0;  // n: output features
  int64_t cols = 0;  // k: input features
  int64_t block_rows = 1;
  int64_t block_cols = 1;
  int64_t GridRows() const { return (rows + block_rows - 1) / block_rows; }
  int64_t GridCols() const { return (cols + block_cols - 1) / block_cols; }
  int64_t NumScales() const { return GridRows() * GridCols(); }
  bool IsPerTensor() const { return block_rows >= rows && block_cols >= cols; }
  bool IsPerChannel() const { return block_rows == 1 && block_cols >= cols; }
};

// How a linear layer quantizes its input activations before the FP8 product.
enum class Fp8ActivationScheme {
  kNone,             // weight-only FP8 (W8A16): activations stay in full precision
  kStaticTensor,     // one calibrated scale for the whole tensor (checkpoint's input_scale)
  kDynamicToken,     // per token (row): scale = max|x_row| / 448
  kDynamicGroup128,  // per token and group of 128 columns (DeepSeek's 1 x 128 blocks)
};

// Quantizes activations x: [m, k] by `scheme` into codes [m, k] and scales: kStaticTensor uses
// *static_scale and writes scales[0] = it; kDynamicToken writes [m]; kDynamicGroup128
// [m, ceil(k / 128)]. A row (group) of zeros gets scale 1. REQUIRES: scheme != kNone,
// static_scale > 0 for kStaticTensor.
void QuantizeActivations(const float* x, int64_t m, int64_t k, Fp8ActivationScheme scheme,
                         float static_scale, uint8_t* codes, float* scales);

// Number of activation scales QuantizeActivations writes.
int64_t NumActivationScales(Fp8ActivationScheme scheme, int64_t m, int64_t k);

// Where the kDynamicGroup128 scale of (row, group) of an activation with `groups` groups a row
// lives: token-major [m, groups] (group_major_ld 0, QuantizeActivations' layout), or group-major
// [groups, group_major_ld] (the block-scaled GEMM's layout, kernels/fp8/fp8_gemm_cuda.h, written
// so by the CUDA quantizers when asked: no transpose before the GEMM). Host and device.
constexpr int64_t Fp8GroupScaleIndex(int64_t row, int64_t group, int64_t groups,
                                     int64_t group_major_ld) {
  return group_major_ld > 0 ? group * group_major_ld + row : row * groups + group;
}

// Quantizes a weight w: [n, k] with per-block scales max|block| / 448 (1 for an all-zero block)
// into codes [n, k] and scales [grid.NumScales()] (row-major over the grid). What online
// quantization (--quantization=fp8) and the tests use.
void QuantizeWeight(const float* w, const Fp8ScaleGrid& grid, uint8_t* codes, float* scales);

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_FP8_FP8_H_
