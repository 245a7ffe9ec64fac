// MoeFp8CutlassGroupedGemm (moe_fp8_cutlass_grouped.h): the one CUTLASS configuration (128 x 128 x
// 128 tiles, clusters of 1 x 2, cooperative, ptr-array grouped with blockwise FP8 scaling at 1 x
// 128 on both operands), the kernel that fills its per-group arguments on the device from the
// expert offsets, and the checks. CUTLASS's types stay in this file.
#include <climits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"

namespace tandem::kernels::cuda {
namespace {

// D[m_e, n] bf16 = A[m_e, k] e4m3 (row-major) x B^T, B = the expert's weight [n, k] row-major
// (CUTLASS's column-major K x N). Scales K-major on both operands at 1 x 128: A's [m_e, groups]
// (QuantizeActivations' layout), B's [n, groups] (the loader's per-row group scales).
struct GroupedConfig {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignmentAB = 16;  // elements: 16 bytes, TMA's minimum
  static constexpr int kAlignmentD = 8;    // 16 bytes of bf16
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, 128, cute::GMMA::Major::K,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void,
      LayoutD*, kAlignmentD, ElementD, LayoutD*, kAlignmentD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                   ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB, ElementB, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlignmentAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
};

using Config = GroupedConfig;
using Gemm = Config::Gemm;

// The per-group arrays at the start of the workspace, each 128-byte aligned; CUTLASS's own after.
struct GroupArrays {
  Config::Shape* shapes;
  const Config::ElementA** a;
  const Config::ElementB** b;
  const float** sfa;
  const float** sfb;
  Config::ElementD** d;
  Config::StrideA* stride_a;
  Config::StrideB* stride_b;
  Config::StrideD* stride_d;
  Config::LayoutSFA* layout_sfa;
  Config::LayoutSFB* layout_sfb;
};

constexpr size_t kAlign = 128;
size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Lays the arrays for `groups` groups out from `base` (null: only counts); returns their bytes.
size_t LayOut(int64_t groups, char* base, GroupArrays* g) {
  size_t offset = 0;
  auto take = [&]<class T>(T** field, size_t element_bytes) {
    *field = base == nullptr ? nullptr : reinterpret_cast<T*>(base + offset);
    offset += AlignUp(element_bytes * static_cast<size_t>(groups));
  };
  take(&g->shapes, sizeof(Config::Shape));
  take(&g->a, sizeof(void*));
  take(&g->b, sizeof(void*));
  take(&g->sfa, sizeof(void*));
  take(&g->sfb, sizeof(void*));
  take(&g->d, sizeof(void*));
  take(&g->stride_a, sizeof(Config::StrideA));
  take(&g->stride_b, sizeof(Config::StrideB));
  take(&g->stride_d, sizeof(Config::StrideD));
  take(&g->layout_sfa, sizeof(Config::LayoutSFA));
  take(&g->layout_sfb, sizeof(Config::LayoutSFB));
  return offset;
}

// One thread per expert: its problem shape (m_e, n, k), operand pointers, strides and scale
// layouts from the device offsets (no host sync).
__global__ void FillGroups(MoeFp8CutlassGroupedArgs args, GroupArrays g) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= args.num_experts) return;
  const int64_t first = args.expert_offsets[e];
  const int m = args.expert_offsets[e + 1] - args.expert_offsets[e];
  const int n = static_cast<int>(args.n), k = static_cast<int>(args.k);
  const int64_t groups = args.k / 128;
  g.shapes[e] = Config::Shape(m, n, k);
  g.a[e] = reinterpret_cast<const Config::ElementA*>(args.a + first * args.k);
  g.b[e] = reinterpret_cast<const Config::ElementB*>(args.w.codes[e]);
  g.sfa[e] = args.a_scales + first * groups;
  g.sfb[e] = args.w.scales[e];
  g.d[e] = reinterpret_cast<Config::ElementD*>(args.out + first * args.n);
  Config::StrideA sa{};
  cute::get<0>(sa) = args.k;
  g.stride_a[e] = sa;
  Config::StrideB sb{};
  cute::get<0>(sb) = args.k;
  g.stride_b[e] = sb;
  Config::StrideD sd{};
  cute::get<0>(sd) = args.n;
  g.stride_d[e] = sd;
  g.layout_sfa[e] = Config::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
  g.layout_sfb[e] = Config::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
}

Gemm::Arguments MakeArguments(int64_t groups, const GroupArrays& g, int device, int sm_count) {
  Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(groups), g.shapes, nullptr},  // no host shapes: no host sync
      {g.a, g.stride_a, g.b, g.stride_b, g.sfa, g.layout_sfa, g.sfb, g.layout_sfb},
      {{}, nullptr, g.stride_d, g.d, g.stride_d}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

absl::Status CheckCutlass(cutlass::Status status, const char* what) {
  if (status == cutlass::Status::kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUTLASS grouped FP8 MoE GEMM: ", what, ": ",
                                          cutlass::cutlassGetStatusString(status)));
}

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

absl::Status CheckExperts(int64_t num_experts) {
  if (num_experts < 1 || num_experts > kMoeFp8CutlassMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFp8CutlassGroupedGemm: ", num_experts,
                                                   " experts (1 to ", kMoeFp8CutlassMaxExperts,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckArgs(const MoeFp8CutlassGroupedArgs& args) {
  RETURN_IF_ERROR(CheckExperts(args.num_experts));
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFp8CutlassGroupedGemm: ", parts...));
  };
  if (args.k <= 0 || args.k % 128 != 0 || args.k > INT_MAX) {
    return bad("k = ", args.k, " is not a positive multiple of 128 (within int)");
  }
  if (args.n <= 0 || args.n % 8 != 0 || args.n > INT_MAX) {
    return bad("n = ", args.n, " is not a positive multiple of 8 (16-byte bf16 rows, within int)");
  }
  if (args.w.groups != args.k / 128) {
    return bad("weight scale groups = ", args.w.groups, ", need k / 128 = ", args.k / 128);
  }
  if (args.a == nullptr || args.a_scales == nullptr || args.w.codes == nullptr ||
      args.w.scales == nullptr || args.expert_offsets == nullptr || args.out == nullptr) {
    return bad("null operand, scale table, offsets or output");
  }
  if (!Aligned(args.a, 16) || !Aligned(args.out, 16) || !Aligned(args.a_scales, 4)) {
    return bad("a and out must be 16-byte aligned, a_scales 4-byte");
  }
  return absl::OkStatus();
}

}  // namespace

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
  using Kernel = Config::Kernel;
  const cudaError_t err =
      cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize);
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("MoeFp8CutlassGroupedGemm: shared-memory opt-in: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> MoeFp8CutlassGroupedWorkspaceBytes(int64_t num_experts) {
  RETURN_IF_ERROR(CheckExperts(num_experts));
  GroupArrays g{};
  const size_t arrays = LayOut(num_experts, nullptr, &g);
  int device = 0, sms = 0;
  DeviceAndSms(&device, &sms);
  return arrays + AlignUp(Gemm::get_workspace_size(MakeArguments(num_experts, g, device, sms)));
}

absl::Status MoeFp8CutlassGroupedGemm(const MoeFp8CutlassGroupedArgs& args, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs(args));
  ASSIGN_OR_RETURN(const size_t needed, MoeFp8CutlassGroupedWorkspaceBytes(args.num_experts));
  if (workspace == nullptr || !Aligned(workspace, kAlign) || workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFp8CutlassGroupedGemm: workspace of ",
                                                   workspace_bytes, " bytes, ", needed,
                                                   " needed, 128-byte aligned"));
  }
  if (!MoeFp8CutlassGroupedSupported()) {
    return absl::FailedPreconditionError("MoeFp8CutlassGroupedGemm: the device is not sm_90");
  }
  GroupArrays g{};
  char* base = static_cast<char*>(workspace);
  const size_t arrays = LayOut(args.num_experts, base, &g);
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((args.num_experts + kThreads - 1) / kThreads);
  FillGroups<<<blocks, kThreads, 0, stream>>>(args, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const Gemm::Arguments gemm_args = MakeArguments(args.num_experts, g, device, sms);
  Gemm gemm;
  RETURN_IF_ERROR(CheckCutlass(gemm.can_implement(gemm_args), "can_implement"));
  RETURN_IF_ERROR(CheckCutlass(gemm.initialize(gemm_args, base + arrays, stream), "initialize"));
  return CheckCutlass(gemm.run(stream), "run");
}

}  // namespace tandem::kernels::cuda
