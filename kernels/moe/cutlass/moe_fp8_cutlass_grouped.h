// The FP8 experts' prefill GEMMs as ONE grouped GEMM (issue 38): CUTLASS 4.2's sm90 ptr-array
// grouped GEMM with blockwise FP8 scaling
// (`KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise`: TMA loads, two consumer warpgroups of
// e4m3 wgmma, the partial sums of each 128-column group promoted into fp32 with their scales), one
// group per expert, for the runtime's prefill steps (runtime/cuda/cuda_moe_fp8.h) where it ran one
// cuBLASLt GEMM per expert and projection after reading the expert offsets back to the host.
//
// No host sync: a small kernel fills CUTLASS's per-group problem shapes, operand pointers and
// scale layouts in the workspace from the device expert offsets; the grid is the persistent
// scheduler's (SM count), not the problem's, so CUTLASS never needs the shapes on the host.
//
// Group e (expert e, m_e = expert_offsets[e + 1] - expert_offsets[e] rows, 0 allowed):
//   A:  a + offsets[e] * k, [m_e, k] e4m3 row-major (the permuted rows, expert-contiguous);
//   SA: a_scales + offsets[e] * (k / 128), [m_e, k / 128] fp32: QuantizeActivations'
//       kDynamicGroup128 layout [rows, groups] as it writes it (no transpose). Activations of the
//       other schemes (a_scheme: kDynamicToken, a_scales [rows], compressed-tensors' and online
//       FP8's per-token scales; kStaticTensor, a_scales[0] for every row, modelopt's and static
//       compressed-tensors') are broadcast first into a_scales_wide [rows, k / 128] (each row's
//       scale on all its groups), which CUTLASS then reads: the same products, as the scale of a
//       row multiplies each group's partial sum instead of the whole sum;
//   B:  w.codes[e], [n, k] e4m3 row-major (the weight as stored);
//   SB, two forms (one CUTLASS configuration each):
//     * row form (block_scales null): w.scales[e], [n, k / 128] fp32, the loader's per-row
//       scales over 128-column groups (CudaFp8Weight::scales), read at granularity 1 row x 128
//       columns: DeepSeek-V3's 128 x 128 blocks held per row and any per-row group scales alike;
//       the mainloop loads and applies 128 weight scales per tile and k step. Per-channel weights
//       (w.groups == 1: one scale per row over all k, compressed-tensors' and online FP8's; the
//       loader holds per-tensor ones as per-channel too) are broadcast first into w_scales_wide
//       [num_experts, n, k / 128] (the experts with rows only);
//     * scaled form (the default where it serves, MoeFp8CutlassScaledFormServes: per-channel
//       weights, w.groups == 1, with per-token or static activations): no scales in the mainloop
//       (CUTLASS's plain FP8 grouped kernel, its partial sums promoted into fp32 every 128 along
//       k), the fp32 sums multiplied by w.scales[e][j] and the row's activation scale in the
//       epilogue: out[r, j] = bf16((sum_c a[r, c] w_e[j, c]) * sb_e[j] * sa[r]). The scratch
//       (a_scales_wide, w_scales_wide) is not read; broadcast_scales = true runs the broadcast
//       row form instead (the same products, scaled per group);
//     * block form (block_scales set): block_scales[e], [ceil(n / 128), block_scale_ld] fp32, one
//       scale per 128 x 128 block (CudaFp8Weight::block_scales: block_scale_ld =
//       Block128WeightScaleLd(k), k / 128 rounded up to 4), read at granularity 128 x 128: one
//       weight scale per tile and k step. CUTLASS's grouped kernel reads rows of exactly k / 128
//       scales, so where block_scale_ld differs (e.g. k = 768: 6 groups, ld 8) the call first
//       copies them into a compact [E, ceil(n / 128), k / 128] array in the workspace (in the same
//       small kernel that fills the per-group arguments). w.scales is not read.
//   D:  out + offsets[e] * n, [m_e, n] bf16 row-major.
// out[r, j] = sum over groups g of (sum_{c in g} a[r, c] w_e[j, c]) * sa[r, g] * sb_e[j, g],
// rounded once to bf16. Rows at or past offsets[E] are not written. The two forms multiply each
// fp32 partial sum p by the scales in another order (row: (p * sa) * sb, block: p * (sa * sb)):
// on weights of true 128 x 128 blocks they agree exactly where the scales' products are exact
// (powers of two), else to fp32 rounding (a bf16 output may then differ in its last place).
// Numerics: as kernels/fp8/cutlass's block GEMM (wgmma's ~13-bit partial sums of 32 products,
// promoted into fp32 every 128 along k).
//
// k need not be a multiple of 128: "k / 128" above is the group count ceil(k / 128)
// (MoeFp8CutlassGroups), the last group partial (its scales cover its columns; TMA reads zeros
// past k, so the last k tile's missing products are 0), as the loader's grids and
// QuantizeActivations' kDynamicGroup128 layout hold such a k (DeepSeek-V2-Lite's dense
// intermediate 10,944 = 85.5 groups).
//
// A single weight (a dense projection run as one group, num_experts 1) may come without device
// tables: args.single_codes / single_scales instead of w.codes / w.scales (the row and scaled
// forms; w.groups still says which).
//
// Requirements (INVALID_ARGUMENT naming the one that fails, nothing launched): 1 <= num_experts
// <= kMoeFp8CutlassMaxExperts, k a positive multiple of 16 (16-byte e4m3 rows for TMA), n a
// positive multiple of 8 (16-byte bf16 rows), row form: w.groups == ceil(k / 128) (or 1 with
// w_scales_wide) and w.scales non-null, block form: block_scale_ld >= ceil(k / 128), single
// weights: num_experts 1, no block scales, both pointers set and w's tables null, a_scheme an FP8
// one (a_scales_wide set unless
// kDynamicGroup128 or the scaled form serves), non-null pointers, a / out 16-byte aligned,
// a_scales and the wide scratch 4-byte,
// rows * k and rows * n within int64, n and k within int; the workspace at least
// MoeFp8CutlassGroupedWorkspaceBytes(num_experts) bytes (block form:
// MoeFp8CutlassGroupedBlockWorkspaceBytes(num_experts, n, k, block_scale_ld)), 128-byte aligned.
// Each expert's codes must be 16-byte aligned, its block scales 4-byte (device tables: not
// checked).
//
// Thread safety: stateless; asynchronous on `stream`; nothing allocated, no host sync. Capturable
// in CUDA graphs once MoeFp8CutlassGroupedInit ran on the device (CUTLASS's initialize writes
// only the workspace's tensormap area with kernels on `stream`).
#ifndef TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_H_
#define TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/moe/moe_fp8_cuda.h"

namespace tandem::kernels::cuda {

inline constexpr int64_t kMoeFp8CutlassMaxExperts = 1024;
// The most k slices of the split form (MoeFp8CutlassGroupedArgs::k_splits).
inline constexpr int kMoeFp8CutlassMaxSplits = 16;

// The 128-column scale groups of a k-wide row (the last one partial where k % 128 != 0).
inline constexpr int64_t MoeFp8CutlassGroups(int64_t k) { return (k + 127) / 128; }

// The split form's columns a slice: ceil(k / splits) rounded up to 128 (to 16 below 128 x
// splits), so ceil(k / MoeFp8CutlassSplitCols(k, splits)) <= splits slices, none empty.
inline constexpr int64_t MoeFp8CutlassSplitCols(int64_t k, int64_t splits) {
  const int64_t per = (k + splits - 1) / splits;
  const int64_t unit = k >= 128 * splits ? 128 : 16;
  return (per + unit - 1) / unit * unit;
}

struct MoeFp8CutlassGroupedArgs {
  const uint8_t* a = nullptr;               // [rows, k] e4m3, expert-contiguous
  const float* a_scales = nullptr;          // [rows, k / 128]
  MoeFp8Experts w;                          // device tables: codes [n, k], scales [n, k / 128]
  const int32_t* expert_offsets = nullptr;  // device [num_experts + 1]
  int64_t num_experts = 0;
  int64_t n = 0;
  int64_t k = 0;
  __nv_bfloat16* out = nullptr;  // [rows, n]
  // The block form: a device table [num_experts] of the experts' block scales [ceil(n / 128),
  // block_scale_ld] (null: the row form, w.scales).
  const float* const* block_scales = nullptr;
  int64_t block_scale_ld = 0;
  // The activation scales' scheme (QuantizeActivations' layout of a_scales): kDynamicGroup128 read
  // in place; kDynamicToken ([rows]) and kStaticTensor ([1]) broadcast into a_scales_wide.
  Fp8ActivationScheme a_scheme = Fp8ActivationScheme::kDynamicGroup128;
  float* a_scales_wide = nullptr;  // [rows, k / 128] scratch: a_scheme != kDynamicGroup128
  // [num_experts, n, k / 128] scratch: the row form on per-channel weights (w.groups == 1 < k /
  // 128).
  float* w_scales_wide = nullptr;
  // Where the scaled form serves, run the broadcast row form instead (an A/B; needs the scratch).
  bool broadcast_scales = false;
  // The operands swapped: D^T [n, m_e] = W x rows^T in 128 x 32 tiles (the weight as the 128-row
  // operand), for groups of a few rows (decode steps). With the scaled form, or the block form on
  // 1 x 128 activation scales (else INVALID_ARGUMENT). The same products and scales (the scaled
  // form: bit for bit; the block form multiplies each partial sum by its scales in the other
  // operand order).
  bool swap_ab = false;
  // Swapped order only: the token tiles of one weight tile scheduled next to each other (CUTLASS's
  // raster order along N), so a weight tile read for 32 rows is read again from L2 for the next
  // 32. Faster for one weight's 33-64 rows (dense decode: Llama-3-8B gate_up at 64 rows 71 -> 46
  // us on an H200), slower for a MoE step's many experts of few rows (Qwen3-30B-A3B decode batch 8
  // +10%): set by the dense caller only. The split form always runs so.
  bool raster_along_tokens = false;
  // Swapped scaled form only: the width of its token tiles, 32 or 64 (else INVALID_ARGUMENT; not
  // with k_splits > 1). 64-row tiles read each weight tile half as often for one weight's 33-64
  // and 129-192 decode rows (runtime/cuda/cuda_fp8_linear.h kFp8WideSwapMinN); the same products
  // and scales, bit for bit (each output element's sum does not depend on the tile's width).
  int swap_token_tile = 32;
  // One weight given directly (num_experts 1, w.codes / w.scales null): its codes [n, k] and its
  // scales (row form [n, ceil(k / 128)], scaled form [n]). For dense projections
  // (runtime/cuda/cuda_fp8_linear.h), which have no device pointer tables.
  const uint8_t* single_codes = nullptr;
  const float* single_scales = nullptr;
  // The split form (swap_ab, the scaled form, a single weight; k_splits in [2,
  // kMoeFp8CutlassMaxSplits]): the k columns cut into slices of MoeFp8CutlassSplitCols(k,
  // k_splits), each slice one group of the plain FP8 grouped kernel writing its fp32 sums into
  // split_partials [slices, split_rows, n] (16-byte aligned scratch), then one kernel adding the
  // slices in order, scaling ((sum * weight scale) * activation scale), adding split_bias [n]
  // (bf16, or null) and rounding once into out. split_rows: the rows of the call
  // (expert_offsets[1] - expert_offsets[0]), known on the host (the reduction's grid). For
  // weights whose 128-row tiles x 32-row token tiles fill too few SMs (decode products). 1: not
  // split (split_bias then unused).
  int k_splits = 1;
  float* split_partials = nullptr;
  const __nv_bfloat16* split_bias = nullptr;
  int64_t split_rows = 0;
};

// Whether `args` runs the scaled form: no block scales, per-channel weight scales (w.groups == 1),
// per-token or static per-tensor activation scales, and broadcast_scales unset.
bool MoeFp8CutlassScaledFormServes(const MoeFp8CutlassGroupedArgs& args);

// Floats of MoeFp8CutlassGroupedArgs::w_scales_wide for calls of up to num_experts experts of
// [n, k] (num_experts x n x ceil(k / 128)).
inline int64_t MoeFp8CutlassWideWeightScales(int64_t num_experts, int64_t n, int64_t k) {
  return num_experts * n * MoeFp8CutlassGroups(k);
}

// Whether the current device runs the kernel (sm_90 exactly: the code is sm_90a).
bool MoeFp8CutlassGroupedSupported();

// The kernels' (both forms') shared-memory opt-in on the current device (a host call: before graph
// capture). FAILED_PRECONDITION where the device is not sm_90.
absl::Status MoeFp8CutlassGroupedInit();

// Device workspace bytes for calls of up to num_experts groups (any n, k, rows) of the row or the
// scaled form: the per-group arrays and CUTLASS's own (tensormaps per SM of the current device).
// INVALID_ARGUMENT for num_experts outside [1, kMoeFp8CutlassMaxExperts].
absl::StatusOr<size_t> MoeFp8CutlassGroupedWorkspaceBytes(int64_t num_experts);

// The block form's workspace for calls of up to num_experts groups of this n, k and
// block_scale_ld: its per-group arrays and CUTLASS's, plus the compact scale copy where
// block_scale_ld != k / 128 (num_experts x ceil(n / 128) x k / 128 floats). INVALID_ARGUMENT as
// MoeFp8CutlassGroupedWorkspaceBytes, or for an n, k or block_scale_ld the call refuses.
absl::StatusOr<size_t> MoeFp8CutlassGroupedBlockWorkspaceBytes(int64_t num_experts, int64_t n,
                                                               int64_t k, int64_t block_scale_ld);

// The grouped product above (the block form where args.block_scales is set). INVALID_ARGUMENT for
// the requirements; FAILED_PRECONDITION on a device that is not sm_90; INTERNAL naming CUTLASS's
// status where it refuses or fails to launch.
absl::Status MoeFp8CutlassGroupedGemm(const MoeFp8CutlassGroupedArgs& args, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_H_
