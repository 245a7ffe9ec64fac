// The epilogue-scaled form (moe_fp8_cutlass_grouped.h, "scaled form"): per-channel weight scales
// (w.groups == 1) with per-token or static per-tensor activation scales. Their scales are constant
// along k, so the mainloop needs none: CUTLASS's plain FP8 ptr-array grouped kernel
// (KernelPtrArrayTmaWarpSpecializedCooperative on e4m3: the wgmma partial sums promoted into fp32
// every 128 along k, as cuBLASLt without FAST_ACCUM) and an epilogue visitor tree that multiplies
// each fp32 sum by its weight row's scale (a row broadcast over D's columns, one pointer per
// group) and its activation row's (a column broadcast over D's rows: per token, or one value
// where static), rounded once to bf16. vLLM runs this design for the same schemes
// (cutlass_moe_mm); CUTLASS 4.2's broadcast nodes take arrays of pointers themselves.
//
// Tiles, clusters and schedule as the other forms (128 x 128 x 128, 1 x 2, cooperative,
// persistent group scheduler).
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {
namespace {

namespace fusion = cutlass::epilogue::fusion;
using cute::_0;
using C = GroupedCommon;

// D = bf16((acc * sw[col]) * sa[row]): sw the group's weight scales [n] (a row vector of D), sa
// the group's activation scales (a column vector of D: [m_e] per token, or sa[0] on every row
// where the stride's bool is false). Both read through per-group pointer arrays.
using WeightScales =
    fusion::Sm90RowBroadcast<0, C::TileShape, float*, float, cute::Stride<_0, bool, _0>>;
using ActScales =
    fusion::Sm90ColBroadcast<0, C::TileShape, float*, float, cute::Stride<bool, _0, _0>>;
using AccTimesWeight =
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float,
                                        cutlass::FloatRoundStyle::round_to_nearest>,
                    WeightScales, fusion::Sm90AccFetch>;
using Scaled = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, C::ElementD, float,
                                                   cutlass::FloatRoundStyle::round_to_nearest>,
                               ActScales, AccTimesWeight>;

using CollectiveEpilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, C::TileShape, C::ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, C::ElementAccumulator, C::ElementAccumulator,
    void, C::LayoutD*, C::kAlignmentD, C::ElementD, C::LayoutD*, C::kAlignmentD,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Scaled>::CollectiveOp;
constexpr int kEpilogueSmemBytes =
    static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage));

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, C::ElementA, C::LayoutA*, C::kAlignmentAB,
    C::ElementB, C::LayoutB*, C::kAlignmentAB, C::ElementAccumulator, C::TileShape, C::ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmemBytes>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel =
    cutlass::gemm::kernel::GemmUniversal<C::ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using StrideA = typename Kernel::InternalStrideA;
using StrideB = typename Kernel::InternalStrideB;
using StrideD = typename Kernel::InternalStrideD;
using Shape = typename C::ProblemShape::UnderlyingProblemShape;

// The per-group arrays at the start of the workspace (128-byte aligned each), CUTLASS's after.
struct Arrays {
  Shape* shapes;
  const C::ElementA** a;
  const C::ElementB** b;
  const float** sa;  // the group's activation scales
  const float** sw;  // the group's weight scales [n]
  C::ElementD** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
};

size_t LayOutScaled(int64_t groups, char* base, Arrays* g) {
  size_t offset = 0;
  auto take = [&]<class T>(T** field, size_t element_bytes) {
    *field = base == nullptr ? nullptr : reinterpret_cast<T*>(base + offset);
    offset += AlignUp(element_bytes * static_cast<size_t>(groups));
  };
  take(&g->shapes, sizeof(Shape));
  take(&g->a, sizeof(void*));
  take(&g->b, sizeof(void*));
  take(&g->sa, sizeof(void*));
  take(&g->sw, sizeof(void*));
  take(&g->d, sizeof(void*));
  take(&g->stride_a, sizeof(StrideA));
  take(&g->stride_b, sizeof(StrideB));
  take(&g->stride_d, sizeof(StrideD));
  return offset;
}

// Thread e < num_experts: expert e's shape, operands and scale pointers from the device offsets.
__global__ void FillScaledGroups(MoeFp8CutlassGroupedArgs args, Arrays g) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= args.num_experts) return;
  const int64_t first = args.expert_offsets[e];
  const int m = args.expert_offsets[e + 1] - args.expert_offsets[e];
  g.shapes[e] = Shape(m, static_cast<int>(args.n), static_cast<int>(args.k));
  g.a[e] = reinterpret_cast<const C::ElementA*>(args.a + first * args.k);
  g.b[e] = reinterpret_cast<const C::ElementB*>(args.w.codes[e]);
  const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
  g.sa[e] = per_row ? args.a_scales + first : args.a_scales;
  g.sw[e] = args.w.scales[e];
  g.d[e] = reinterpret_cast<C::ElementD*>(args.out + first * args.n);
  StrideA sa{};
  cute::get<0>(sa) = args.k;
  g.stride_a[e] = sa;
  StrideB sb{};
  cute::get<0>(sb) = args.k;
  g.stride_b[e] = sb;
  StrideD sd{};
  cute::get<0>(sd) = args.n;
  g.stride_d[e] = sd;
}

typename Gemm::Arguments MakeScaledArguments(int64_t groups, const Arrays& g, bool per_row,
                                             int device, int sm_count) {
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                {static_cast<int>(groups), g.shapes, nullptr},
                                {g.a, g.stride_a, g.b, g.stride_b},
                                {{}, nullptr, g.stride_d, g.d, g.stride_d}};
  auto& fusion_args = args.epilogue.thread;
  fusion_args = {{g.sa, 0.0f, {per_row, _0{}, _0{}}},         // ActScales
                 {{g.sw, 0.0f, {_0{}, true, _0{}}}, {}, {}},  // AccTimesWeight
                 {}};                                         // the product's rounding
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

}  // namespace

size_t ScaledWorkspaceBytes(int64_t groups, int device, int sm_count) {
  Arrays g{};
  const size_t arrays = LayOutScaled(groups, nullptr, &g);
  return arrays +
         AlignUp(Gemm::get_workspace_size(MakeScaledArguments(groups, g, true, device, sm_count)));
}

absl::Status ScaledInit() {
  const cudaError_t err =
      cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "MoeFp8CutlassGroupedGemm: shared-memory opt-in (scaled form): ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

absl::Status ScaledRun(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                       int sm_count, cudaStream_t stream) {
  Arrays g{};
  const size_t arrays = LayOutScaled(args.num_experts, workspace, &g);
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((args.num_experts + kThreads - 1) / kThreads);
  FillScaledGroups<<<blocks, kThreads, 0, stream>>>(args, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
  const typename Gemm::Arguments gemm_args =
      MakeScaledArguments(args.num_experts, g, per_row, device, sm_count);
  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(gemm_args);
  if (can != cutlass::Status::kSuccess) return CheckCutlass(can, "can_implement (scaled form)");
  const cutlass::Status init = gemm.initialize(gemm_args, workspace + arrays, stream);
  if (init != cutlass::Status::kSuccess) return CheckCutlass(init, "initialize (scaled form)");
  return CheckCutlass(gemm.run(stream), "run (scaled form)");
}

}  // namespace tandem::kernels::cuda::moe_cutlass
