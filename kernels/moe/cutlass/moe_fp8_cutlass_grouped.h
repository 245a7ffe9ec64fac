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
//       kDynamicGroup128 layout [rows, groups] as it writes it (no transpose);
//   B:  w.codes[e], [n, k] e4m3 row-major (the weight as stored);
//   SB: w.scales[e], [n, k / 128] fp32: the loader's per-row scales over 128-column groups
//       (CudaFp8Weight::scales), read directly: CUTLASS's scale granularity is 1 row x 128
//       columns on both operands, so DeepSeek-V3's 128 x 128 blocks held per row and any per-row
//       group scales are taken alike (no compact block copy);
//   D:  out + offsets[e] * n, [m_e, n] bf16 row-major.
// out[r, j] = sum over groups g of (sum_{c in g} a[r, c] w_e[j, c]) * sa[r, g] * sb_e[j, g],
// rounded once to bf16. Rows at or past offsets[E] are not written.
// Numerics: as kernels/fp8/cutlass's block GEMM (wgmma's ~13-bit partial sums of 32 products,
// promoted into fp32 every 128 along k).
//
// Requirements (INVALID_ARGUMENT naming the one that fails, nothing launched): 1 <= num_experts
// <= kMoeFp8CutlassMaxExperts, k a positive multiple of 128, n a positive multiple of 8 (16-byte
// bf16 rows), w.groups == k / 128, non-null pointers, a / out 16-byte aligned, a_scales 4-byte,
// rows * k and rows * n within int64, n and k within int; the workspace at least
// MoeFp8CutlassGroupedWorkspaceBytes(num_experts) bytes, 128-byte aligned. Each expert's codes
// must be 16-byte aligned (device tables: not checked).
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

struct MoeFp8CutlassGroupedArgs {
  const uint8_t* a = nullptr;               // [rows, k] e4m3, expert-contiguous
  const float* a_scales = nullptr;          // [rows, k / 128]
  MoeFp8Experts w;                          // device tables: codes [n, k], scales [n, k / 128]
  const int32_t* expert_offsets = nullptr;  // device [num_experts + 1]
  int64_t num_experts = 0;
  int64_t n = 0;
  int64_t k = 0;
  __nv_bfloat16* out = nullptr;  // [rows, n]
};

// Whether the current device runs the kernel (sm_90 exactly: the code is sm_90a).
bool MoeFp8CutlassGroupedSupported();

// The kernel's shared-memory opt-in on the current device (a host call: before graph capture).
// FAILED_PRECONDITION where the device is not sm_90.
absl::Status MoeFp8CutlassGroupedInit();

// Device workspace bytes for calls of up to num_experts groups (any n, k, rows): the per-group
// arrays and CUTLASS's own (tensormaps per SM of the current device). INVALID_ARGUMENT for
// num_experts outside [1, kMoeFp8CutlassMaxExperts].
absl::StatusOr<size_t> MoeFp8CutlassGroupedWorkspaceBytes(int64_t num_experts);

// The grouped product above. INVALID_ARGUMENT for the requirements; FAILED_PRECONDITION on a
// device that is not sm_90; INTERNAL naming CUTLASS's status where it refuses or fails to launch.
absl::Status MoeFp8CutlassGroupedGemm(const MoeFp8CutlassGroupedArgs& args, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_H_
