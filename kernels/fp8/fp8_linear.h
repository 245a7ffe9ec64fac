// FP8 linear layer, CPU reference: out[m, n] = dequant(quant(a))[m, k] . dequant(w)[n, k]^T
// (+ bias[n]), computed in fp32. The activations are first quantized as the layer's scheme says
// (fp8.h: none, static per-tensor, dynamic per-token, dynamic 1 x 128 groups) and dequantized,
// the weight dequantized block by block (w = code * scale of its block), then both go through
// the fp32 GEMM (kernels/gemm). Slow next to a real FP8 GEMM, but it is the definition the CUDA
// kernels are tested against, and what the CPU backend serves FP8 checkpoints with.
//
// Thread-safe for distinct outputs; `pool` as kernels/gemm/linear.h.
#ifndef TANDEM_KERNELS_FP8_FP8_LINEAR_H_
#define TANDEM_KERNELS_FP8_FP8_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8/fp8.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels {

// A non-owning view of one FP8 linear layer's weight and its quantization scheme.
struct Fp8WeightView {
  const uint8_t* codes = nullptr;  // [grid.rows, grid.cols] e4m3fn, nn.Linear layout [n, k]
  const float* scales = nullptr;   // [grid.NumScales()], row-major over the scale grid
  Fp8ScaleGrid grid;
  Fp8ActivationScheme activation = Fp8ActivationScheme::kDynamicToken;
  float input_scale = 0.0f;  // kStaticTensor: the calibrated activation scale (> 0)
};

// INVALID_ARGUMENT for null codes / scales, an empty or non-positive block, or a static scheme
// without a positive finite input_scale.
absl::Status ValidateFp8Weight(const Fp8WeightView& w);

namespace cpu {

// a: [m, k] with k = w.grid.cols; bias: [n] or null; out: [m, n] (n = w.grid.rows), not
// overlapping the inputs. Any m >= 0; any k (a partial last 128-group or block is a group of
// its own). Errors: ValidateFp8Weight's.
absl::Status Fp8Linear(const float* a, const Fp8WeightView& w, const float* bias, int64_t m,
                       float* out, ThreadPool* pool);

// The weight dequantized: out[n, k] = code * block scale (what Fp8Linear multiplies by).
void DequantizeFp8Weight(const Fp8WeightView& w, int64_t row_begin, int64_t num_rows, float* out);

}  // namespace cpu
}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_FP8_FP8_LINEAR_H_
