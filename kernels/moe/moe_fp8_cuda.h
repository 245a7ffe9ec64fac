// FP8 experts on the device (issues 38 and 32): the decode expert GEMVs of moe_cuda.h reading
// e4m3 expert weights with their scales, as FP8 MoE checkpoints ship them:
//   * DeepSeek-V3 (quant_method "fp8", 128 x 128 weight blocks, 1 x 128 activation groups): the
//     loader holds the block scales per row over 128-column groups (kernels/fp8/fp8.h's grid with
//     block_rows 1, block_cols 128), so a weight row has ceil(k / 128) scales;
//   * compressed-tensors FP8_DYNAMIC (Qwen3-MoE by llm-compressor): per-channel weight scales
//     (one per row) with dynamic per-token activations; static per-tensor activation scales and
//     weight-only FP8 (16-bit activations) take the same kernels.
// The activations are either bf16 values (weight-only, Fp8ActivationScheme::kNone) or the e4m3
// codes and scales kernels/fp8's cuda::QuantizeActivations wrote for the checkpoint's scheme
// (static per-tensor, per token, 1 x 128 groups): the gate_up input per token of x [T, H], the
// down input per permuted row of act [rows, I] (cpu::Fp8Linear quantizes each expert's rows the
// same way: every scheme is row-local or global). Each 16-column chunk's dot product is exact in
// the e4m3 codes' values and scaled once by its weight scale x activation scale; fp32
// accumulation; the results are cpu::Fp8Linear's (kernels/fp8/fp8_linear.h) up to fp32 summation
// order, rounded to bf16 as the bf16 GEMVs round: gate and up to bf16, then SiLU(g) * u.
//
// The experts' weights are addressed through device tables of per-expert pointers (each expert
// its own allocation, as the runtime's per-expert FP8 GEMMs need: runtime/cuda/cuda_moe_fp8.h).
// Prefill-sized steps run the experts through kernels/fp8's FP8 GEMM per expert (the runtime);
// these GEMVs take any number of rows (weights re-streamed once per 8 rows of an expert), so they
// also serve every CUDA graph size without a host sync.
//
// Thread safety: stateless; asynchronous on `stream`; capturable in CUDA graphs.
#ifndef TANDEM_KERNELS_MOE_MOE_FP8_CUDA_H_
#define TANDEM_KERNELS_MOE_MOE_FP8_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8/fp8.h"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {

// One projection of every expert: expert e's codes [rows_e, k] e4m3 (rows_e = 2 * inter for
// gate_up: gate rows then up rows; hidden for down) at codes[e], its scales at scales[e]:
// [rows_e, groups] fp32 with groups = 1 (one scale per row: per-channel, or per-tensor written
// per row) or ceil(k / 128) (128-column groups: DeepSeek's blocks as the loader holds them).
// codes / scales are DEVICE arrays of num_experts device pointers; codes 16-byte aligned.
struct MoeFp8Experts {
  const uint8_t* const* codes = nullptr;
  const float* const* scales = nullptr;
  int64_t groups = 1;
};

// The activations of one call: bf16 values (kNone) or codes [rows, k] and scales
// (NumActivationScales(scheme, rows, k) of QuantizeActivations' layout).
struct MoeFp8Activations {
  Fp8ActivationScheme scheme = Fp8ActivationScheme::kNone;
  const __nv_bfloat16* values = nullptr;
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// act[r, j] = round(silu(g) * u), g = round(x_t . gate_up_e[j]), u = round(x_t . gate_up_e[inter
// + j]) (dequantized), t = token_of_row[r], e the expert of row r: x [T, hidden] as `x` holds it
// (values or codes per token); act [rows, inter] bf16.
// INVALID_ARGUMENT (nothing launched) unless hidden and inter are positive multiples of 16,
// groups is 1 or ceil(hidden / 128), the activation pointers match the scheme, values / codes are
// 16-byte aligned, and 1 <= num_experts <= kMoeMaxExperts. rows = T * k (host) bounds the grid.
// programmatic_launch: PDL as moe_cuda.h's GEMVs.
absl::Status MoeFp8ExpertGemvGateUp(const MoeFp8Activations& x, const MoeFp8Experts& gate_up,
                                    int64_t hidden, int64_t inter, const DeviceMoePermutation& perm,
                                    int64_t num_experts, int64_t rows, __nv_bfloat16* act,
                                    cudaStream_t stream, bool programmatic_launch = false);

// out[r, h] = round(act_r . down_e[h]) (dequantized): act [rows, inter] (values or codes per
// row), out [rows, hidden] bf16; groups 1 or ceil(inter / 128). Requirements as GateUp's.
absl::Status MoeFp8ExpertGemvDown(const MoeFp8Activations& act, const MoeFp8Experts& down,
                                  int64_t hidden, int64_t inter, const DeviceMoePermutation& perm,
                                  int64_t num_experts, int64_t rows, __nv_bfloat16* out,
                                  cudaStream_t stream, bool programmatic_launch = false);

// The tensor-core form for steps where experts have several rows (decode batches past ~16
// tokens, every CUDA graph size; moe_fp8_grouped_mma_cuda.cu): out[r, :n] = round(sum over
// 128-column groups g of (a_src(r) . w_e[:, g]) x weight scale x activation scale), the dot
// products of the e4m3 codes on mma.sync m16n8k32 (fp32 accumulation, folded per group), for every
// row r in [offsets[e], offsets[e+1]) of every expert e; src(r) = a_row_index[r] (the gather folded
// in: gate_up reads x [T, k] through token_of_row) or r when null. w: [n, k] codes per expert; out
// [rows, n] bf16 (gate_up: gate and up, for MoeSiluAndMul). The activations are codes and scales
// (any scheme but kNone). `rows` (host) = offsets[E] or more: bounds the grid; no host sync,
// capturable. INVALID_ARGUMENT (nothing launched) for kNone, n odd, k not a positive multiple of
// 16, groups neither 1 nor ceil(k / 128), codes not 16-byte aligned, experts outside [1,
// kMoeMaxExperts]. MoeFp8GroupedMmaInit(): the shared-memory opt-in, needed once before a call made
// under stream capture (uncaptured calls make it themselves).
absl::Status MoeFp8GroupedMmaInit();
absl::Status MoeFp8GroupedMma(const MoeFp8Activations& a, const int32_t* a_row_index,
                              const MoeFp8Experts& w, const int32_t* expert_offsets,
                              int64_t num_experts, int64_t rows, int64_t n, int64_t k,
                              __nv_bfloat16* out, cudaStream_t stream);

// The grouped prefill's activation passes (moe_fp8_act_cuda.cu; runtime/cuda/cuda_moe_fp8.h's
// CUTLASS path), each one kernel where it replaced two and bit for bit what the two give:
//
// MoeGatherFp8Rows: the permuted rows of x already quantized ONCE per token (QuantizeActivations
// of x [T, k] into codes / scales): out_codes [rows, k] and out_scales (kDynamicGroup128 [rows,
// ceil(k / 128)], kDynamicToken [rows]; kStaticTensor: none, the caller keeps scales[0]) of row r
// = token_of_row[r]'s. Every scheme is row-local, so this equals gathering the bf16 rows
// (MoeGatherRows) and quantizing them, at a T-row quantization instead of a T * top_k-row one and
// 1-byte rows instead of 2-byte ones. INVALID_ARGUMENT for k not a positive multiple of 16, a
// non-FP8 scheme, rows < 0, null or (codes) not 16-byte aligned pointers.
absl::Status MoeGatherFp8Rows(const uint8_t* codes, const float* scales, int64_t k,
                              Fp8ActivationScheme scheme, const int32_t* token_of_row, int64_t rows,
                              uint8_t* out_codes, float* out_scales, cudaStream_t stream);

// MoeSiluAndMulQuantFp8: act = MoeSiluAndMul<bf16>(gate_up) ([rows, 2 * inter] -> [rows, inter];
// skipped where act is null) and its e4m3 codes [rows, inter] + scales as QuantizeActivations
// writes them for `scheme` (static_scale for kStaticTensor), quantizing the ROUNDED bf16 values,
// in one pass (1 x 128 groups: a warp per two groups of a row; per token and static: a warp per
// row, per token keeping the row's rounded values in shared memory for the codes up to 3,072
// columns, recomputing them past that; TANDEM_MOE_FP8_SILU_STASH=0: always recompute). A width not
// a multiple of 8 or pointers not 16-byte aligned run the two kernels (act then required).
// INVALID_ARGUMENT for a non-FP8 scheme, a non-positive static scale, rows < 0, inter < 1, null
// gate_up / codes / scales.
absl::Status MoeSiluAndMulQuantFp8(const __nv_bfloat16* gate_up, int64_t rows, int64_t inter,
                                   Fp8ActivationScheme scheme, float static_scale,
                                   __nv_bfloat16* act, uint8_t* codes, float* scales,
                                   cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_FP8_CUDA_H_
