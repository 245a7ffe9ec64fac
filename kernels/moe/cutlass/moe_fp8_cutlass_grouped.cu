// MoeFp8CutlassGroupedGemm (moe_fp8_cutlass_grouped.h): the checks, the workspace queries and the
// dispatch to the five configurations (moe_fp8_cutlass_grouped_config.h: the row form in
// moe_fp8_cutlass_grouped_row.cu, the block form in moe_fp8_cutlass_grouped_block.cu and, swapped,
// _block_swap.cu, the scaled form in moe_fp8_cutlass_grouped_scaled.cu and, swapped, _swap.cu). No
// CUTLASS types here.
#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"

namespace tandem::kernels::cuda {
namespace {

constexpr size_t kAlign = 128;
size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The current device and its SM count (0, 0 without one: CUTLASS asks device 0).
void DeviceAndSms(int* device, int* sms) {
  if (cudaGetDevice(device) != cudaSuccess ||
      cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *device) != cudaSuccess) {
    (void)cudaGetLastError();
    *device = 0;
    *sms = 0;
  }
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class... Parts>
absl::Status Bad(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat("MoeFp8CutlassGroupedGemm: ", parts...));
}

absl::Status CheckExperts(int64_t num_experts) {
  if (num_experts < 1 || num_experts > kMoeFp8CutlassMaxExperts) {
    return Bad(num_experts, " experts (1 to ", kMoeFp8CutlassMaxExperts, ")");
  }
  return absl::OkStatus();
}

absl::Status CheckShape(int64_t n, int64_t k) {
  if (k <= 0 || k % 16 != 0 || k > INT_MAX) {
    return Bad("k = ", k, " is not a positive multiple of 16 (16-byte e4m3 rows, within int)");
  }
  if (n <= 0 || n % 8 != 0 || n > INT_MAX) {
    return Bad("n = ", n, " is not a positive multiple of 8 (16-byte bf16 rows, within int)");
  }
  return absl::OkStatus();
}

absl::Status CheckBlockLd(int64_t k, int64_t ld) {
  if (ld < MoeFp8CutlassGroups(k) || ld > INT_MAX) {
    return Bad("block scale rows of ", ld,
               " floats, need at least ceil(k / 128) = ", MoeFp8CutlassGroups(k));
  }
  return absl::OkStatus();
}

// The compact block-scale copy's bytes (0 where CUTLASS reads the block scales in place).
size_t CompactBytes(int64_t num_experts, int64_t n, int64_t k, int64_t ld) {
  const int64_t groups = MoeFp8CutlassGroups(k);
  if (ld == groups) return 0;
  return AlignUp(static_cast<size_t>(num_experts * ((n + 127) / 128) * groups) * sizeof(float));
}

// The block form's arrays and CUTLASS workspace, swapped or not (the compact copy after them).
size_t BlockGemmBytes(int64_t num_experts, int device, int sms) {
  return AlignUp(std::max(moe_cutlass::BlockWorkspaceBytes(num_experts, device, sms),
                          moe_cutlass::BlockSwapWorkspaceBytes(num_experts, device, sms)));
}

absl::Status CheckArgs(const MoeFp8CutlassGroupedArgs& args) {
  RETURN_IF_ERROR(CheckExperts(args.num_experts));
  RETURN_IF_ERROR(CheckShape(args.n, args.k));
  const bool scaled = MoeFp8CutlassScaledFormServes(args);
  const int64_t groups = MoeFp8CutlassGroups(args.k);
  const bool single = args.single_codes != nullptr || args.single_scales != nullptr;
  if (single &&
      (args.num_experts != 1 || args.block_scales != nullptr || args.single_codes == nullptr ||
       args.single_scales == nullptr || args.w.codes != nullptr || args.w.scales != nullptr)) {
    return Bad(
        "a single weight needs num_experts 1, no block scales, single_codes and single_scales, "
        "and no expert tables");
  }
  if (args.k_splits != 1) {
    if (args.k_splits < 2 || args.k_splits > kMoeFp8CutlassMaxSplits || !args.swap_ab || !scaled ||
        !single || args.split_partials == nullptr || !Aligned(args.split_partials, 16) ||
        args.split_rows < 0 || args.split_rows > INT_MAX) {
      return Bad("k_splits = ", args.k_splits, " needs 2 to ", kMoeFp8CutlassMaxSplits,
                 " slices, swap_ab on the scaled form of a single weight, 16-byte aligned "
                 "split_partials and split_rows within int");
    }
  }
  if (args.block_scales != nullptr) {
    RETURN_IF_ERROR(CheckBlockLd(args.k, args.block_scale_ld));
  } else if (args.w.groups != groups &&
             (args.w.groups != 1 || (args.w_scales_wide == nullptr && !scaled))) {
    return Bad("weight scale groups = ", args.w.groups, ", need ceil(k / 128) = ", groups,
               " (or 1, per channel, with w_scales_wide or per-token / per-tensor activations)");
  }
  if (args.swap_token_tile != 32 &&
      (args.swap_token_tile != 64 || !args.swap_ab || !scaled || args.k_splits != 1)) {
    return Bad("swap_token_tile = ", args.swap_token_tile,
               " needs 32, or 64 on the swapped scaled form without k_splits");
  }
  if (args.swap_ab && !scaled &&
      (args.block_scales == nullptr || args.a_scheme != Fp8ActivationScheme::kDynamicGroup128)) {
    return Bad(
        "swap_ab needs the scaled form (per-channel weight scales, per-token or static "
        "activation scales, no block scales, broadcast_scales unset) or the block form with 1 x "
        "128 activation scales");
  }
  using Scheme = Fp8ActivationScheme;
  if (args.a_scheme == Scheme::kNone) return Bad("activations without FP8 scales (kNone)");
  if (args.a_scheme != Scheme::kDynamicGroup128 && args.a_scales_wide == nullptr && !scaled) {
    return Bad(
        "per-token or per-tensor activation scales need a_scales_wide (or per-channel "
        "weight scales)");
  }
  if (!Aligned(args.a_scales_wide, 4) || !Aligned(args.w_scales_wide, 4)) {
    return Bad("a_scales_wide and w_scales_wide must be 4-byte aligned");
  }
  if (args.a == nullptr || args.a_scales == nullptr || (!single && args.w.codes == nullptr) ||
      (!single && args.block_scales == nullptr && args.w.scales == nullptr) ||
      args.expert_offsets == nullptr || args.out == nullptr) {
    return Bad("null operand, scale table, offsets or output");
  }
  if (!Aligned(args.a, 16) || !Aligned(args.out, 16) || !Aligned(args.a_scales, 4)) {
    return Bad("a and out must be 16-byte aligned, a_scales 4-byte");
  }
  return absl::OkStatus();
}

}  // namespace

bool MoeFp8CutlassScaledFormServes(const MoeFp8CutlassGroupedArgs& args) {
  using Scheme = Fp8ActivationScheme;
  return args.block_scales == nullptr && args.w.groups == 1 && !args.broadcast_scales &&
         (args.a_scheme == Scheme::kDynamicToken || args.a_scheme == Scheme::kStaticTensor);
}

bool MoeFp8CutlassGroupedSupported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

absl::Status MoeFp8CutlassGroupedInit() {
  if (!MoeFp8CutlassGroupedSupported()) {
    return absl::FailedPreconditionError("MoeFp8CutlassGroupedGemm: the device is not sm_90");
  }
  RETURN_IF_ERROR(moe_cutlass::RowInit());
  RETURN_IF_ERROR(moe_cutlass::ScaledInit());
  RETURN_IF_ERROR(moe_cutlass::SwapInit());
  RETURN_IF_ERROR(moe_cutlass::Swap64Init());
  RETURN_IF_ERROR(moe_cutlass::SplitInit());
  RETURN_IF_ERROR(moe_cutlass::BlockSwapInit());
  return moe_cutlass::BlockInit();
}

absl::StatusOr<size_t> MoeFp8CutlassGroupedWorkspaceBytes(int64_t num_experts) {
  RETURN_IF_ERROR(CheckExperts(num_experts));
  int device = 0, sms = 0;
  DeviceAndSms(&device, &sms);
  return std::max({moe_cutlass::RowWorkspaceBytes(num_experts, device, sms),
                   moe_cutlass::ScaledWorkspaceBytes(num_experts, device, sms),
                   moe_cutlass::SwapWorkspaceBytes(num_experts, device, sms),
                   moe_cutlass::Swap64WorkspaceBytes(num_experts, device, sms),
                   moe_cutlass::SplitWorkspaceBytes(device, sms)});
}

absl::StatusOr<size_t> MoeFp8CutlassGroupedBlockWorkspaceBytes(int64_t num_experts, int64_t n,
                                                               int64_t k, int64_t block_scale_ld) {
  RETURN_IF_ERROR(CheckExperts(num_experts));
  RETURN_IF_ERROR(CheckShape(n, k));
  RETURN_IF_ERROR(CheckBlockLd(k, block_scale_ld));
  int device = 0, sms = 0;
  DeviceAndSms(&device, &sms);
  return BlockGemmBytes(num_experts, device, sms) + CompactBytes(num_experts, n, k, block_scale_ld);
}

absl::Status MoeFp8CutlassGroupedGemm(const MoeFp8CutlassGroupedArgs& args, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs(args));
  const bool block = args.block_scales != nullptr;
  ASSIGN_OR_RETURN(const size_t needed,
                   block ? MoeFp8CutlassGroupedBlockWorkspaceBytes(args.num_experts, args.n, args.k,
                                                                   args.block_scale_ld)
                         : MoeFp8CutlassGroupedWorkspaceBytes(args.num_experts));
  if (workspace == nullptr || !Aligned(workspace, kAlign) || workspace_bytes < needed) {
    return Bad("workspace of ", workspace_bytes, " bytes, ", needed, " needed, 128-byte aligned");
  }
  if (!MoeFp8CutlassGroupedSupported()) {
    return absl::FailedPreconditionError("MoeFp8CutlassGroupedGemm: the device is not sm_90");
  }
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  char* base = static_cast<char*>(workspace);
  if (args.k_splits > 1) {
    return moe_cutlass::SplitRun(args, args.split_rows, base, device, sms, stream);
  }
  if (MoeFp8CutlassScaledFormServes(args)) {
    if (!args.swap_ab) return moe_cutlass::ScaledRun(args, base, device, sms, stream);
    return args.swap_token_tile == 64 ? moe_cutlass::Swap64Run(args, base, device, sms, stream)
                                      : moe_cutlass::SwapRun(args, base, device, sms, stream);
  }
  if (!block) return moe_cutlass::RowRun(args, base, device, sms, stream);
  // The compact copy after the block form's arrays and CUTLASS's workspace.
  const size_t gemm_bytes = BlockGemmBytes(args.num_experts, device, sms);
  float* compact = args.block_scale_ld == MoeFp8CutlassGroups(args.k)
                       ? nullptr
                       : reinterpret_cast<float*>(base + gemm_bytes);
  return args.swap_ab ? moe_cutlass::BlockSwapRun(args, base, compact, device, sms, stream)
                      : moe_cutlass::BlockRun(args, base, compact, device, sms, stream);
}

}  // namespace tandem::kernels::cuda
