// CutlassFp8BlockGemm: checks the problem, lays out the workspace (the padded activation-scale
// copy where m % 4 != 0, then CUTLASS's own), and runs one configuration
// (cutlass_block_gemm_config.h). No CUTLASS header here: those are in the per-configuration .cu
// files.
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/cutlass/cutlass_block_gemm.h"
#include "kernels/fp8/cutlass/cutlass_block_gemm_config.h"

namespace tandem::kernels::cuda {
namespace {

using cutlass_block::Problem;

constexpr size_t kWorkspaceAlign = 128;
size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

CutlassBlockTile PickTile(const CutlassFp8BlockGemmArgs& args) {
  if (args.tile != CutlassBlockTile::kAuto) return args.tile;
  return args.m <= 64 ? CutlassBlockTile::kPingpong64 : CutlassBlockTile::kCooperative128;
}

// The sizes' requirements (pointers are checked by CutlassFp8BlockGemm).
absl::Status CheckSizes(const CutlassFp8BlockGemmArgs& args) {
  if (args.m < 0 || args.n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CutlassFp8BlockGemm: negative m = ", args.m, " or n = ", args.n));
  }
  if (args.k <= 0 || args.k % 128 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CutlassFp8BlockGemm: k = ", args.k, " is not a positive multiple of 128"));
  }
  if (args.n % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CutlassFp8BlockGemm: n = ", args.n,
                                                   " is not a multiple of 8 (16-byte bf16 rows)"));
  }
  if (args.w_scale_ld < args.k / 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CutlassFp8BlockGemm: w_scale_ld = ", args.w_scale_ld, " < k / 128 = ", args.k / 128));
  }
  // CUTLASS's problem shape and scale strides are ints; m * k and n * k are 64-bit strides.
  const int64_t m_pad = (args.m + 3) / 4 * 4;
  if (m_pad > INT_MAX || args.n > INT_MAX || args.k > INT_MAX || m_pad * (args.k / 128) > INT_MAX ||
      (args.n + 127) / 128 * args.w_scale_ld > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CutlassFp8BlockGemm: m = ", args.m, ", n = ", args.n, ", k = ", args.k, " too large"));
  }
  if (args.swizzle != 0 && args.swizzle != 1 && args.swizzle != 2 && args.swizzle != 4 &&
      args.swizzle != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("CutlassFp8BlockGemm: swizzle = ", args.swizzle, " is not 0, 1, 2, 4 or 8"));
  }
  if (args.raster < 0 || args.raster > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("CutlassFp8BlockGemm: raster = ", args.raster, " is not 0, 1 or 2"));
  }
  if (args.tile != CutlassBlockTile::kAuto && CutlassBlockTileName(args.tile)[0] == '?') {
    return absl::InvalidArgumentError("CutlassFp8BlockGemm: unknown tile");
  }
  return absl::OkStatus();
}

// Bytes of the padded activation-scale copy (0 where m % 4 == 0: the caller's scales are read).
size_t ScaleCopyBytes(const CutlassFp8BlockGemmArgs& args) {
  if (args.m % 4 == 0) return 0;
  return AlignUp(static_cast<size_t>((args.m + 3) / 4 * 4) * (args.k / 128) * sizeof(float));
}

// The problem CUTLASS sees, a_scales pointing at the caller's scales (the copy is made later).
Problem MakeProblem(const CutlassFp8BlockGemmArgs& args) {
  Problem p;
  p.a = args.a;
  p.a_scales = args.a_scales;
  p.a_scale_ld = (args.m + 3) / 4 * 4;
  p.w = args.w;
  p.w_scales = args.w_scales;
  p.w_scale_ld = args.w_scale_ld;
  p.m = args.m;
  p.n = args.n;
  p.k = args.k;
  p.out = args.out;
  p.swizzle = args.swizzle == 0 ? kCutlassBlockSwizzle : args.swizzle;
  p.raster = args.raster;
  return p;
}

// One configuration's entry points (cutlass_block_gemm_config.h).
struct ConfigCalls {
  size_t (*workspace_bytes)(const Problem&);
  absl::Status (*init)();
  absl::Status (*run)(const Problem&, void*, cudaStream_t);
};

ConfigCalls Calls(CutlassBlockTile tile) {
  namespace cb = cutlass_block;
  switch (tile) {
    case CutlassBlockTile::kPingpong64:
      return {cb::Pingpong64WorkspaceBytes, cb::Pingpong64Init, cb::Pingpong64Run};
    default:
      return {cb::Cooperative128WorkspaceBytes, cb::Cooperative128Init, cb::Cooperative128Run};
  }
}

absl::Status CheckPointers(const CutlassFp8BlockGemmArgs& args, void* workspace,
                           size_t workspace_bytes) {
  if (args.a == nullptr || args.a_scales == nullptr || args.w == nullptr ||
      args.w_scales == nullptr || args.out == nullptr) {
    return absl::InvalidArgumentError("CutlassFp8BlockGemm: null operand, scale or output");
  }
  if (!Aligned16(args.a) || !Aligned16(args.w) || !Aligned16(args.out) ||
      !Aligned16(args.a_scales) || reinterpret_cast<uintptr_t>(args.w_scales) % 4 != 0) {
    return absl::InvalidArgumentError(
        "CutlassFp8BlockGemm: a, w, out and a_scales must be 16-byte aligned, w_scales 4-byte");
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0) {
    return absl::InvalidArgumentError("CutlassFp8BlockGemm: workspace not 128-byte aligned");
  }
  ASSIGN_OR_RETURN(const size_t needed, CutlassFp8BlockGemmWorkspaceBytes(args));
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("CutlassFp8BlockGemm: workspace of ",
                                                   workspace_bytes, " bytes, ", needed, " needed"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* CutlassBlockTileName(CutlassBlockTile tile) {
  switch (tile) {
    case CutlassBlockTile::kAuto:
      return "auto";
    case CutlassBlockTile::kCooperative128:
      return "coop128";
    case CutlassBlockTile::kPingpong64:
      return "pp64";
  }
  return "?";
}

bool CutlassFp8BlockGemmSupported() {
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

absl::Status CutlassFp8BlockGemmInit() {
  if (!CutlassFp8BlockGemmSupported()) {
    return absl::FailedPreconditionError("CutlassFp8BlockGemm: the device is not sm_90");
  }
  for (CutlassBlockTile tile : kCutlassBlockTiles) RETURN_IF_ERROR(Calls(tile).init());
  return absl::OkStatus();
}

absl::StatusOr<size_t> CutlassFp8BlockGemmWorkspaceBytes(const CutlassFp8BlockGemmArgs& args) {
  RETURN_IF_ERROR(CheckSizes(args));
  if (args.m == 0 || args.n == 0) return size_t{0};
  // The current device's SM count, as CutlassFp8BlockGemm passes it (Stream-K's workspace depends
  // on it; CUTLASS would otherwise ask device 0). Without a device: 0, CUTLASS's own query.
  Problem p = MakeProblem(args);
  if (cudaGetDevice(&p.device) != cudaSuccess ||
      cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, p.device) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    p.device = 0;
    p.sm_count = 0;
  }
  return ScaleCopyBytes(args) + AlignUp(Calls(PickTile(args)).workspace_bytes(p));
}

absl::Status CutlassFp8BlockGemm(const CutlassFp8BlockGemmArgs& args, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSizes(args));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointers(args, workspace, workspace_bytes));
  if (!CutlassFp8BlockGemmSupported()) {
    return absl::FailedPreconditionError("CutlassFp8BlockGemm: the device is not sm_90");
  }
  Problem p = MakeProblem(args);
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&p.device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, p.device));
  const size_t copy_bytes = ScaleCopyBytes(args);
  if (copy_bytes > 0) {
    // [groups, m] -> [groups, m rounded up to 4]: TMA needs the rows' stride 16-byte aligned.
    // The padding entries stay as they were: they scale only rows >= m, which are not stored.
    float* padded = static_cast<float*>(workspace);
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(padded, p.a_scale_ld * sizeof(float), args.a_scales,
                                           args.m * sizeof(float), args.m * sizeof(float),
                                           args.k / 128, cudaMemcpyDeviceToDevice, stream));
    p.a_scales = padded;
  }
  void* cutlass_workspace = copy_bytes > 0 ? static_cast<char*>(workspace) + copy_bytes : workspace;
  return Calls(PickTile(args)).run(p, cutlass_workspace, stream);
}

}  // namespace tandem::kernels::cuda
