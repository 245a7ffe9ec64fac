// FP8 projections of the CUDA model (issue 38): one linear layer's e4m3 weight and scales on the
// device (as the loader holds them: LayerWeights::*_fp8, scales per output row over blocks of 128
// columns or the whole row), and CudaFp8Linear, which multiplies bf16 activations by it:
//   * m = 1 and scales per 128-column group (DeepSeek's 128 x 128 blocks, Qwen3's FP8
//     checkpoints; w8a16_gemv(), on by default): "fp8-w8a16-gemv", the weight-only GEMV
//     cuda::Fp8W16Gemv (kernels/fp8/fp8_w8a16_gemv_cuda.h, kAuto) on the bf16 activations as
//     they are, whatever the weight's activation scheme: no QuantizeActivations pass (one kernel
//     instead of two a projection) and closer to the unquantized model than W8A8 (numerics:
//     cpu::Fp8Linear with scheme kNone);
//   * m <= kFp8SmallMMaxM (decode): cuda::Fp8SmallMLinear (kernels/fp8/fp8_gemv_cuda.h), which
//     reads the weight once for all rows, on cuda::QuantizeActivations' codes (its fused
//     quantization measured slower: kFusedQuantMaxM), on the codes the preceding RMSNorm /
//     SiLU-and-mul wrote with the quantization fused in (codes_ready, per-token weights), or,
//     weight-only, the bf16 activations;
//   * kFp8SwapGemmMinM <= m <= kFp8SwapGemmMaxM rows of a weight of at least
//     kFp8SwapGemmMinElements codes with whole-row scales (per-channel / per-tensor) and a
//     per-token or static activation scheme, where CUTLASS is built and the device is sm_90
//     (decode_gemm() kAuto): "fp8-cutlass-swap-gemm", CUTLASS's grouped FP8 GEMM
//     (kernels/moe/cutlass: the scaled form with the operands swapped, the weight as the 128-row
//     wgmma operand and the tokens as 32-wide tiles, both scales in the epilogue) run as one group
//     on the weight itself, or, where the weight's tiles would leave SMs idle (SwapSplits), split
//     along k into slices whose fp32 sums one kernel adds, scales and rounds. At these m cuBLASLt
//     streamed the weight at 1.2-2.8 TB/s and the small-m GEMV at 1.3-2.7 from 9 rows on; the
//     swapped GEMM at 2.7-3.8 on the large weights (kernels/fp8/BENCHMARKS.md, twenty-fourth
//     session: fp8_linear_bench). Smaller weights keep the GEMV to 16 rows and cuBLASLt above:
//     the GEMM's fixed cost (its argument kernel, tensor-map set-up, a second launch when split)
//     outweighs their few microseconds of bytes;
//   * larger m, whole-row weight scales and a per-token or static activation scheme: the
//     cuBLASLt FP8 GEMM (CublasLtFp8Gemm kTokenChannel: per-token x per-channel scale vectors, a
//     static scale being a preallocated vector of max_tokens copies): on an H200 cuBLASLt's
//     outer-vector scale mode, else its unit-scaled fp32 product into a preallocated accumulator
//     (256 MiB, chunks of rows) and one epilogue kernel applying both scales and the bias;
//   * larger m, 128 x 128 weight blocks (every 128-row block's rows share their scales: a
//     DeepSeek checkpoint, block_scales filled at upload; k a multiple of 512 columns' worth of
//     groups, see CublasLtFp8Gemm) with 1x128 activation groups: the
//     block-scaled cuBLASLt FP8 GEMM (CublasLtFp8Gemm kBlock128), the activation scales
//     transposed into its layout, on m rounded down to a multiple of 4 (cuBLASLt has no kernel
//     for other m), the last m % 4 rows on the chunked GEMV below;
//   * larger m, scales per row over 128-column groups that no block GEMM takes (the rows of a
//     128-row block differ: fused parts meeting off a block boundary, as DeepSeek-V2-Lite's dense
//     gate_up at 10,944; or k not a multiple of 128, its dense down) with FP8 activations (1x128,
//     per token or static): "fp8-cutlass-row-gemm", CUTLASS's grouped blockwise GEMM
//     (kernels/moe/cutlass, the row form: the weight's 128 scales a tile and k step) run as one
//     group on the weight itself (MoeFp8CutlassGroupedArgs::single_codes), where CUTLASS is
//     built and the device is sm_90, a bias added after its bf16 output (TANDEM_FP8_ROW_GEMM=0
//     at Create: off, for A/B runs);
//   * larger m otherwise (1x128 groups with whole-row weight scales, weight-only FP8, or a shape
//     no GEMM here has a kernel for): the SLOW PATH "fp8-gemv-chunks":
//     Fp8SmallMLinear over chunks of 16 rows, which re-streams the weight every 16 tokens. Correct
//     (the GEMV's per-block scaling) but far from GEMM speed.
// Numerics are cpu::Fp8Linear's (kernels/fp8): fp32 accumulation, one rounding to bf16.
//
// Thread safety: not thread-safe (the workspace and cuBLASLt plans); one model drives it.
// CUDA graphs: allocates nothing after Create and never synchronizes (warm each GEMM shape up).
#ifndef TANDEM_RUNTIME_CUDA_CUDA_FP8_LINEAR_H_
#define TANDEM_RUNTIME_CUDA_CUDA_FP8_LINEAR_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/dummy_draw.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

// Which kernel multiplies whole-row-scaled weights (per-channel or per-tensor, with per-token or
// static activations) at decode-sized m: kAuto (the measured choice, below), or one forced for A/B
// runs (TANDEM_FP8_DECODE_GEMM=auto|auto32|gemv|cublaslt|swap at Create): kAutoNarrow kAuto
// before the wide token tiles (32-row tiles, 9-64 rows: the twenty-fourth session's choice);
// kGemv the small-m GEMV up to 16 rows and cuBLASLt beyond, as before the swapped GEMM; kCublasLt
// cuBLASLt from 2 rows; kCutlassSwap the swapped CUTLASS GEMM from 2 rows (where it serves).
enum class Fp8DecodeGemm { kAuto, kAutoNarrow, kGemv, kCublasLt, kCutlassSwap };

// kAuto's swapped CUTLASS GEMM: rows [kFp8SwapGemmMinM, kFp8SwapGemmMaxM] of weights of at least
// kFp8SwapGemmMinElements codes (the GEMV below, cuBLASLt above and for smaller weights beyond
// 16 rows). Measured on an H200 (kernels/fp8/BENCHMARKS.md, twenty-fourth session): up to 8 rows
// the GEMV was fastest on every Llama-3 shape; from 9 to 64 rows the swapped GEMM on weights of
// >= 32 Mi codes (Llama-3-8B's gate_up and down, every Llama-3-70B projection at TP 1 and 2);
// beyond 64 rows cuBLASLt.
inline constexpr int64_t kFp8SwapGemmMinM = 9;
inline constexpr int64_t kFp8SwapGemmMaxM = 64;
inline constexpr int64_t kFp8SwapGemmMinElements = int64_t{32} << 20;
// kAuto's 64-row token tiles (MoeFp8CutlassGroupedArgs::swap_token_tile), on weights of those
// sizes with at least kFp8WideSwapMinN rows (80 weight tiles: Llama-3-70B's qkv at TP 1, every
// gate_up): for 33-64 rows (one token tile instead of two), and for kFp8WideSwapMinM to
// kFp8WideSwapMaxM rows, where cuBLASLt's 128-row tiles compute a second, mostly empty row tile
// (kernels/fp8/BENCHMARKS.md, twenty-fifth session: Llama-3-70B gate_up at 160 / 192 rows 282 /
// 281 -> 229 / 233 us, qkv 78 / 70 -> 48 / 46 us on an H200). Measured slower there: the o and
// down projections (fewer weight tiles), 65-128 and 193-256 rows (cuBLASLt's tiles fit).
inline constexpr int64_t kFp8WideSwapMinN = 10240;
inline constexpr int64_t kFp8WideSwapMinM = 129;
inline constexpr int64_t kFp8WideSwapMaxM = 192;

// One FP8 weight on the device; empty() for a bf16/fp16 projection.
struct CudaFp8Weight {
  DeviceBuffer codes;              // [n, k] e4m3
  DeviceBuffer scales;             // [n * GridCols] fp32 (block_rows 1)
  DeviceBuffer static_act_scales;  // kStaticTensor: [max_tokens] copies of input_scale
  // 128 x 128 blocks with 1x128 activations: [ceil(n / 128), Block128WeightScaleLd(k)] in
  // cuBLASLt's layout (kernels::cuda::Block128WeightScales), for the block-scaled GEMM; empty
  // for other weights.
  DeviceBuffer block_scales;
  kernels::Fp8ScaleGrid grid;
  kernels::Fp8ActivationScheme activation = kernels::Fp8ActivationScheme::kNone;
  float input_scale = 0.0f;
  // Device dummy weights of a 128 x 128-block config (AllocateFp8DummyWeight): FillFp8Dummy
  // draws one scale per 128 x 128 tile of each checkpoint tensor (held per row as above).
  bool dummy_tiles = false;
  bool empty() const { return codes.empty(); }
  // The codes and per-row scales as the decode kernels take them.
  kernels::cuda::Fp8DeviceWeight device() const {
    return {codes.get<uint8_t>(), scales.get<float>(), grid};
  }
  int64_t bytes() const {
    return codes.bytes() + scales.bytes() + static_act_scales.bytes() + block_scales.bytes();
  }
};

// Device buffers for a weight of `grid` (uninitialised codes and scales; the static activation
// scale vector filled). INVALID_ARGUMENT unless block_rows is 1, block_cols 128 or the whole
// row, k a multiple of 16, and a static scheme has a positive input_scale.
absl::StatusOr<CudaFp8Weight> AllocateFp8Weight(const kernels::Fp8ScaleGrid& grid,
                                                kernels::Fp8ActivationScheme activation,
                                                float input_scale, int64_t max_tokens);

// Uploads a loaded FP8 weight (codes and scales copied as they are), freeing the host copy;
// a 1x128-activation weight whose 128-row blocks share their scales also gets block_scales.
// `what` names it in errors; `rows` / `cols`: the shape the model expects.
absl::StatusOr<CudaFp8Weight> UploadFp8Weight(Fp8LinearWeight* host, int64_t rows, int64_t cols,
                                              int64_t max_tokens, const std::string& what);

// A device dummy FP8 weight [n, k] of a config quantized as `q` (Fp8QuantizedGrid; a 128 x 128
// config's tiles: dummy_tiles, and block_scales for 1 x 128 activations), codes and scales zero.
absl::StatusOr<CudaFp8Weight> AllocateFp8DummyWeight(const WeightQuantization& q, int64_t n,
                                                     int64_t k, int64_t max_tokens);

// Device dummy FP8 weight rows: draws `fill` (whole rows of the weight, starting at element
// fill.offset: one checkpoint tensor or its TP slice) in fp32 into `staging`
// (fill.slice.numel() floats) and quantizes them on the device per row or per 128 columns (the
// weight's grid), or in 128 x 128 tiles from the fill's first row (dummy_tiles; the block
// scales written too, and dropped when a fill starts inside a 128-row block, as
// UploadFp8Weight finds such a checkpoint's), as QuantizeWeightsFp8 does the host draw: the CPU
// dummy path's codes and scales.
absl::Status FillFp8Dummy(const DummyTensorFill& fill, uint64_t seed, float* staging,
                          CudaFp8Weight* w, cudaStream_t stream);
// The same with `staging` grown to the fill's draw where it is smaller (once the stream's
// earlier fills no longer read it): the dummy loaders' one staging buffer across fills.
absl::Status FillFp8Dummy(const DummyTensorFill& fill, uint64_t seed, DeviceBuffer* staging,
                          CudaFp8Weight* w, cudaStream_t stream);

class CudaFp8Linear {
 public:
  // Workspace for up to `max_tokens` rows of up to `max_k` input features. The decode kernel
  // (kernels/fp8/fp8_gemv_cuda.h's Fp8GemvKernel) is kAuto unless the environment variable
  // TANDEM_FP8_GEMV_KERNEL says "pipelined", "pipelined_one_early", "pipelined_l2",
  // "pipelined_late", "streaming" or "register" (A/B runs of decode_step_bench; INVALID_ARGUMENT
  // for another value).
  // TANDEM_FP8_W16_GEMV=0 starts it with w8a16_gemv() off (A/B runs); TANDEM_FP8_GROUP_CODES=0
  // with TakesTokenCodes false for 1 x 128-group weights (their producers' fused quantization
  // off: A/B runs); TANDEM_FP8_GROUP_MAJOR=0 with GroupMajorScales false (the group scales
  // transposed before each block GEMM, as before: A/B runs).
  static absl::StatusOr<std::unique_ptr<CudaFp8Linear>> Create(int64_t max_tokens, int64_t max_k);

  // Batch 1 of a weight with per-128-column scales on the weight-only W8A16 GEMV (the header
  // comment; true by default) or, off, on QuantizeActivations + the W8A8 GEMV as before. The
  // models set it from CudaModelOptions::fp8_weight_only_fold.
  void set_w8a16_gemv(bool on) { w8a16_gemv_ = on; }
  bool w8a16_gemv() const { return w8a16_gemv_; }

  // The W8A16 GEMV's inner loop (kernels/fp8/fp8_w8a16_gemv_cuda.h's Fp8W16Math; kAuto by
  // default). kTensorCoreSplitK uses w16_split_k() (the whole-k tiles before ReserveW16SplitK).
  void set_w8a16_math(kernels::cuda::Fp8W16Math math) { w8a16_math_ = math; }
  kernels::cuda::Fp8W16Math w8a16_math() const { return w8a16_math_; }
  // Grows the split-k workspace this object owns to weights of up to `weight_rows` rows (kept
  // when it holds them), its counters zeroed; `splits`: Fp8W16SplitKWorkspace::splits (0: S
  // picked per launch). Synchronous (cudaMalloc, cudaMemset): call while loading, outside graph
  // capture. The GEMVs that take it (Linear's, and the models' folded layers through
  // w16_split_k()) must run in one stream's order.
  absl::Status ReserveW16SplitK(int64_t weight_rows, int splits = 0);
  // Null before ReserveW16SplitK.
  const kernels::cuda::Fp8W16SplitKWorkspace* w16_split_k() const {
    return w16_split_k_rows_ > 0 ? &w16_split_k_ : nullptr;
  }

  // The kernel of whole-row-scaled weights at decode-sized m (Fp8DecodeGemm).
  void set_decode_gemm(Fp8DecodeGemm g) { decode_gemm_ = g; }
  Fp8DecodeGemm decode_gemm() const { return decode_gemm_; }
  // The swapped GEMM's token tile forced (MoeFp8CutlassGroupedArgs::swap_token_tile: 32 or 64;
  // TANDEM_FP8_SWAP_TOKENS at Create), or 0 (default): SwapTokenTile's choice. A 64-row tile
  // runs unsplit.
  void set_swap_token_tile(int rows) { swap_token_tile_ = rows; }
  int swap_token_tile() const { return swap_token_tile_; }
  // The token tile the swapped GEMM takes for m rows of an [n, k] weight: the forced one, else
  // under kAuto 64 where kFp8WideSwapMinN says (and SwapSplits would not split), else 32.
  int SwapTokenTile(int64_t m, int64_t n, int64_t k) const;

  // cuBLASLt FP8 GEMM plans (m > kFp8SmallMMaxM) for m <= max_m first used from now on are
  // chosen by timing (CublasLtFp8Gemm::set_autotune_max_m); the models forward their
  // set_gemm_autotune_max_m here, as for their bf16 GEMMs. 0 (default): the heuristic's first.
  void set_gemm_autotune_max_m(int64_t max_m) { gemm_->set_autotune_max_m(max_m); }

  // out[m, n] = a . w^T (+ bias[n]); a: [m, k] bf16, out: [m, n] bf16 (k, n = w.grid's).
  // INVALID_ARGUMENT outside the workspace's bounds or for unaligned pointers.
  // programmatic_launch: the decode kernels (m <= 16) are launched with PDL, as
  // kernels/gemm/cuda/gemv_cuda.h's SmallMLinear.
  // codes_ready: a fused producer (kernels/fp8/fp8_fused_quant_cuda.h) already wrote a's
  // codes and scales (per token or per 1 x 128 group, as w quantizes) into token_codes(w); no
  // quantization pass runs (a is unused; INVALID_ARGUMENT unless TakesTokenCodes(w, m)).
  absl::Status Linear(const __nv_bfloat16* a, const CudaFp8Weight& w, const __nv_bfloat16* bias,
                      int64_t m, __nv_bfloat16* out, cudaStream_t stream,
                      bool programmatic_launch = false, bool codes_ready = false);

  // True when `w` quantizes its input per token (kDynamicToken) or per 1 x 128 group
  // (kDynamicGroup128, except where the batch-1 W8A16 GEMV takes bf16 activations) and m x k
  // fits the workspace: a fused producer may then write the codes into token_codes(w) for
  // Linear(codes_ready).
  bool TakesTokenCodes(const CudaFp8Weight& w, int64_t m) const;
  // The workspace a fused producer writes the codes [m, k] of m rows for w and their scales
  // into: [m] per token, or per group (group128) for a kDynamicGroup128 weight, [m, ceil(k /
  // 128)], or group-major [ceil(k / 128), m] where Linear's block-scaled GEMM takes all m rows
  // (GroupMajorScales: the GEMM's own layout, no transpose).
  kernels::cuda::Fp8TokenCodes token_codes(const CudaFp8Weight& w, int64_t m) const {
    return {codes_.get<uint8_t>(), scales_.get<float>(),
            w.activation == kernels::Fp8ActivationScheme::kDynamicGroup128,
            GroupMajorScales(w, m) ? m : 0};
  }
  // Whether Linear runs m rows of w wholly on the block-scaled GEMM (1 x 128 activation groups,
  // m a multiple of 4 past the GEMV's rows), which reads the activation scales group-major: its
  // quantization (or the fused producer, token_codes) writes them so, no TransposeGroupScales.
  bool GroupMajorScales(const CudaFp8Weight& w, int64_t m) const;

  // Which path Linear takes for `m` rows of `w` with w8a16_gemv() as given ("fp8-w8a16-gemv",
  // "fp8-gemv", "fp8-cutlass-swap-gemm" (where `row_gemm`), "cublaslt-fp8-gemm",
  // "fp8-block-gemm" (CUTLASS where built, else cuBLASLt), "fp8-cutlass-row-gemm" (where
  // `row_gemm`: an object's row_gemm()) or the slow "fp8-gemv-chunks"); a cuBLASLt shape without
  // a kernel also falls back to the row GEMM or the chunks, and the W8A16 GEMV is skipped (for
  // "fp8-gemv") for codes_ready or activations not 16-byte aligned.
  static const char* PathFor(const CudaFp8Weight& w, int64_t m, bool w8a16_gemv = true,
                             bool row_gemm = RowGemmAvailable(),
                             Fp8DecodeGemm decode_gemm = Fp8DecodeGemm::kAuto);
  // Whether this build and device run the one-group CUTLASS row GEMM (CUTLASS built, sm_90).
  static bool RowGemmAvailable();
  // Whether this object runs it (RowGemmAvailable() unless TANDEM_FP8_ROW_GEMM=0 at Create).
  bool row_gemm() const { return !row_gemm_workspace_.empty(); }
  // The k slices the swapped GEMM cuts an [n, k] weight into for m rows (1: not split): the
  // count in [1, kMoeFp8CutlassMaxSplits] with the least modelled time (waves of 128-row weight
  // tiles x 32-row token tiles x slices, each streaming its slice, plus the fp32 sums written and
  // read), where that is at least 10% below not splitting; slices of at least 512 columns, their
  // sums within the split scratch.
  int SwapSplits(int64_t m, int64_t n, int64_t k) const;
  // The path the last successful Linear call took (PathFor's names; "" before any): differs
  // from PathFor only where cuBLASLt had no kernel for the shape and the chunks ran instead.
  const char* last_path() const { return last_path_; }

 private:
  CudaFp8Linear() = default;
  // The row GEMM's workspace and offsets (Create, where RowGemmAvailable()).
  absl::Status CreateRowGemm();
  // out[m, n] = codes_ . w^T on the row GEMM (the activations already quantized; no bias);
  // swap_ab: the swapped scaled form (whole-row weight scales only), k_splits > 1 its split form
  // (split_partials_; split_bias added in its reduction).
  // a_scales: the activation scales token-major (null: scales_).
  absl::Status RowGemm(const CudaFp8Weight& w, int64_t m, __nv_bfloat16* out, cudaStream_t stream,
                       bool swap_ab = false, int k_splits = 1,
                       const __nv_bfloat16* split_bias = nullptr, const float* a_scales = nullptr);
  // out[m, n] = codes_ . w^T (+ bias) on the swapped GEMM, split along k as SwapSplits says.
  absl::Status SwapGemm(const CudaFp8Weight& w, int64_t m, const __nv_bfloat16* bias,
                        __nv_bfloat16* out, cudaStream_t stream);
  // Rows [first_row, m) on the small-m kernel, 16 at a time (a_scales as RowGemm's).
  absl::Status GemvChunks(const CudaFp8Weight& w, const __nv_bfloat16* a, const __nv_bfloat16* bias,
                          int64_t m, __nv_bfloat16* out, cudaStream_t stream, int64_t first_row = 0,
                          const float* a_scales = nullptr);

  int64_t max_tokens_ = 0, max_k_ = 0;
  kernels::cuda::Fp8GemvKernel gemv_kernel_ = kernels::cuda::Fp8GemvKernel::kAuto;
  bool w8a16_gemv_ = true;
  int swap_token_tile_ = 0;
  bool group_codes_ = true;  // TakesTokenCodes for kDynamicGroup128 weights
  bool group_major_ = true;  // GroupMajorScales may be true
  kernels::cuda::Fp8W16Math w8a16_math_ = kernels::cuda::Fp8W16Math::kAuto;
  Fp8DecodeGemm decode_gemm_ = Fp8DecodeGemm::kAuto;
  DeviceBuffer w16_split_k_mem_;  // Fp8W16SplitKWorkspaceBytes(w16_split_k_rows_)
  kernels::cuda::Fp8W16SplitKWorkspace w16_split_k_;
  int64_t w16_split_k_rows_ = 0;
  const char* last_path_ = "";
  std::unique_ptr<kernels::cuda::CublasLtFp8Gemm> gemm_;
  DeviceBuffer codes_;             // [max_tokens, max_k] e4m3 activations
  DeviceBuffer scales_;            // [max_tokens * ceil(max_k / 128)] fp32
  DeviceBuffer block_act_scales_;  // the same transposed for the block-scaled GEMM
  // The row GEMM's CUTLASS workspace (empty: no row GEMM) and its expert offsets: pairs {0, m}
  // for m = 0 .. max_tokens, so a call of m rows passes row_gemm_offsets_ + 2 m (no upload).
  DeviceBuffer row_gemm_workspace_;
  DeviceBuffer row_gemm_offsets_;
  // The swapped GEMM's split sums [slices, m, n] fp32 (kSplitScratchBytes) and the SM count.
  DeviceBuffer split_partials_;
  int sm_count_ = 0;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_FP8_LINEAR_H_
