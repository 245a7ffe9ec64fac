// DeepSeek's block-scaled FP8 GEMM (1 x 128 activation groups, 128 x 128 weight blocks, bf16
// out) on CUTLASS's sm90 kernel (CUTLASS 4.2, `KernelTmaWarpSpecializedCooperativeFP8Blockwise`:
// TMA loads, two consumer warpgroups of e4m3 wgmma, each 128-column group's partial sums promoted
// into fp32 with their scales; the kernel vLLM runs for block FP8 on Hopper). A maintained
// library's kernel beside cuBLASLt's block modes and our own `Fp8BlockGemmWgmma`
// (kernels/fp8/fp8_gemm_cuda.h, fp8_block_gemm_cuda.h); not the runtime's default.
//
// Built only where the CUTLASS headers are found (@cutlass, third_party/cutlass/); elsewhere this
// target does not exist and the block GEMM stays on cuBLASLt.
//
// Operands and scales are exactly CublasLtFp8Gemm::Linear's kBlock128 layouts (fp8_gemm_cuda.h),
// so one set of buffers feeds either:
//   a:        [m, k] e4m3, row-major;
//   a_scales: [ceil(k / 128), m] fp32, group-major: the TransposeGroupScales of
//             QuantizeActivations' kDynamicGroup128 scales [m, groups] (what CUTLASS's
//             M-major scale layout reads by TMA);
//   w:        [n, k] e4m3, row-major (the nn.Linear weight as stored);
//   w_scales: [ceil(n / 128), w_scale_ld] fp32, row b = 128-row block b, column g = group g
//             (w_scale_ld >= ceil(k / 128); CublasLtFp8Gemm uses Block128WeightScaleLd(k));
//   out:      [m, n] bf16, row-major.
// out[i, j] = sum over groups g of (sum_{c in g} a[i, c] w[j, c]) * a_scales[g * m + i]
//             * w_scales[(j / 128) * w_scale_ld + g], rounded once to bf16.
// Numerics: as cuBLASLt's block kernels (wgmma's ~13-bit partial sums of 32 products, promoted
// into fp32 every 128 along k).
//
// Requirements (INVALID_ARGUMENT naming the one that fails): m >= 0, n >= 0 (0: nothing
// launched), k a positive multiple of 128, n a multiple of 8 (the bf16 rows' 16-byte TMA
// stores; a partial last 128-row weight block is fine), a / w / out 16-byte aligned, a_scales
// 16-byte aligned, w_scale_ld >= ceil(k / 128), workspace at least
// CutlassFp8BlockGemmWorkspaceBytes. Where m is not a multiple of 4 the activation scales are first
// copied into the workspace with rows of m rounded up to 4 (TMA needs 16-byte strides); the padding
// is never read into a stored row.
//
// Thread safety: stateless; asynchronous on `stream`; nothing allocated, no synchronization, so
// usable inside CUDA graph capture once CutlassFp8BlockGemmInit ran on the device.
#ifndef TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_H_
#define TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// The CUTLASS configurations instantiated (each one kernel; more cost compile time: README.md).
//   kCooperative128: 128 x 128 x 128 tiles, clusters of 1 x 2 (the activation tile multicast to
//     two n-tiles), two consumer warpgroups on one tile (vLLM's sm90 block-FP8 config);
//   kPingpong64: 64 x 128 x 128 tiles, no cluster, the two consumer warpgroups on alternate
//     tiles (less padding for small m);
//   kAuto: kPingpong64 for m <= 64, else kCooperative128.
enum class CutlassBlockTile {
  kAuto,
  kCooperative128,
  kPingpong64,
};

// Every configuration but kAuto (tests and benchmarks force each).
inline constexpr CutlassBlockTile kCutlassBlockTiles[] = {CutlassBlockTile::kCooperative128,
                                                          CutlassBlockTile::kPingpong64};

// A short name for printing ("coop128", "pp64"; "auto").
const char* CutlassBlockTileName(CutlassBlockTile tile);

struct CutlassFp8BlockGemmArgs {
  const uint8_t* a = nullptr;       // [m, k] e4m3
  const float* a_scales = nullptr;  // [ceil(k / 128), m]
  const uint8_t* w = nullptr;       // [n, k] e4m3
  const float* w_scales = nullptr;  // [ceil(n / 128), w_scale_ld]
  int64_t w_scale_ld = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  __nv_bfloat16* out = nullptr;  // [m, n]
  CutlassBlockTile tile = CutlassBlockTile::kAuto;
  // The persistent tile scheduler's order (no effect on the result, which does not depend on the
  // grid): output tiles visited in groups of `swizzle` (1, 2, 4 or 8) tile rows / columns, for L2
  // reuse; 0 = kCutlassBlockSwizzle. raster: 0 = CUTLASS's heuristic (along the longer side),
  // 1 = along m, 2 = along n.
  int swizzle = 0;
  int raster = 0;
};

// The swizzle CutlassFp8BlockGemmArgs::swizzle = 0 takes (BENCHMARKS.md, twenty-eighth session).
inline constexpr int kCutlassBlockSwizzle = 1;

// Whether the current device runs the kernels (sm_90 exactly: the code is sm_90a).
bool CutlassFp8BlockGemmSupported();

// The kernels' shared-memory opt-in on the current device (a host call: before graph capture).
// FAILED_PRECONDITION where the device is not sm_90.
absl::Status CutlassFp8BlockGemmInit();

// Device workspace bytes CutlassFp8BlockGemm needs for these args (pointers not read; 0 is a
// possible answer). INVALID_ARGUMENT as CutlassFp8BlockGemm for bad sizes.
absl::StatusOr<size_t> CutlassFp8BlockGemmWorkspaceBytes(const CutlassFp8BlockGemmArgs& args);

// out = the block-scaled product above. workspace: device memory of at least
// CutlassFp8BlockGemmWorkspaceBytes(args) bytes, 128-byte aligned (null when that is 0); not
// used by another call on another stream at the same time. INVALID_ARGUMENT for the
// requirements above; FAILED_PRECONDITION on a device that is not sm_90; INTERNAL naming
// CUTLASS's status where it refuses or fails to launch.
absl::Status CutlassFp8BlockGemm(const CutlassFp8BlockGemmArgs& args, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_H_
