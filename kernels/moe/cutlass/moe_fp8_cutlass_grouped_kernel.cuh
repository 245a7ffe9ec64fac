// Internal to :moe_fp8_cutlass_grouped: the blockwise-scaled CUTLASS configurations of the grouped
// FP8 GEMM as types (cooperative, ptr-array grouped with blockwise FP8 scaling; the tiles of
// GroupedTiles), the kernel that fills their per-group arguments on the device from the expert
// offsets, and the host calls that run them (LaunchGemm, Init also serve the scaled form's
// moe_fp8_cutlass_grouped_scaled.cuh). Included by one .cu file per configuration
// (moe_fp8_cutlass_grouped_row.cu, _block.cu, _block_swap.cu): nvcc compiles them in parallel,
// and CUTLASS's types stay inside them.
#ifndef TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_KERNEL_CUH_
#define TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_KERNEL_CUH_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
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

namespace tandem::kernels::cuda::moe_cutlass {

// D[m_e, n] bf16 = A[m_e, k] e4m3 (row-major) x B^T, B = the expert's weight [n, k] row-major
// (CUTLASS's column-major K x N). Scales K-major on both operands: A's per (1 row, 128 columns)
// [m_e, groups] (QuantizeActivations' layout); B's per (kScaleN rows, 128 columns): kScaleN 1,
// the loader's per-row group scales [n, groups]; kScaleN 128, one per 128 x 128 block
// [ceil(n / 128), groups].
//
// CUTLASS 4.2's grouped kernel derives each group's scale layouts from its problem shape
// (tile_atom_to_shape_SF*(m_e, n, k)) and ignores the layout arrays it is given: a scale row is
// exactly ceil(k / 128) floats. The runtime's block scales have rows of Block128WeightScaleLd(k) (k
// / 128 rounded up to 4); where that differs the block form runs on a compact copy (BlockRun).
//
// GroupedCommon: what every configuration shares (operand types, layouts, alignments, the group
// problem shape). GroupedTiles<kSwap>: the tiles of the two operand orders, rows first (128 x 128
// x 128, clusters of 1 x 2, D row-major) or the weight first (128 x 32 x 128, no cluster, D
// column-major: D^T [n, m_e]).
struct GroupedCommon {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  static constexpr int kAlignmentAB = 16;  // elements: 16 bytes, TMA's minimum
  static constexpr int kAlignmentD = 8;    // 16 bytes of bf16
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
};

template <bool kSwap>
struct GroupedTiles : GroupedCommon {
  using TileShape = std::conditional_t<kSwap, cute::Shape<cute::_128, cute::_32, cute::_128>,
                                       cute::Shape<cute::_128, cute::_128, cute::_128>>;
  using ClusterShape = std::conditional_t<kSwap, cute::Shape<cute::_1, cute::_1, cute::_1>,
                                          cute::Shape<cute::_1, cute::_2, cute::_1>>;
  using LayoutD =
      std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
};

// The plain FP8 mainloop of the scaled and split forms (no scales in it: CUTLASS's
// KernelPtrArrayTmaWarpSpecializedCooperative on e4m3, its wgmma partial sums promoted into fp32
// every 128 along k), both operands K-major, its stages fitted beside the epilogue's shared memory.
template <class TileShape, class ClusterShape, int kEpilogueSmemBytes>
using PlainFp8Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, GroupedCommon::ElementA,
    GroupedCommon::LayoutA*, GroupedCommon::kAlignmentAB, GroupedCommon::ElementB,
    GroupedCommon::LayoutB*, GroupedCommon::kAlignmentAB, GroupedCommon::ElementAccumulator,
    TileShape, ClusterShape, cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmemBytes>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

// The blockwise-scaled configurations: scales per (kScaleM rows, 128 columns) of A and per
// (kScaleN rows, 128 columns) of B, K-major. Rows first (kSwap false): A the rows' 1 x 128 scales,
// B the weight's per row (kScaleN 1, the row form) or per 128 x 128 block (kScaleN 128, the block
// form). Swapped (args.swap_ab, the block form only): A the weight's block scales (kScaleM 128),
// B the rows' 1 x 128 scales (kScaleN 1: 32 scales a tile and k step).
template <int kScaleM, int kScaleN, bool kSwapOrder>
struct BlockwiseConfig : GroupedTiles<kSwapOrder> {
  using Tiles = GroupedTiles<kSwapOrder>;
  using typename Tiles::ClusterShape;
  using typename Tiles::LayoutD;
  using typename Tiles::TileShape;
  static constexpr bool kBlockScales = kScaleM > 1 || kScaleN > 1;
  static constexpr bool kSwap = kSwapOrder;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*,
      GroupedCommon::kAlignmentD, GroupedCommon::ElementD, LayoutD*, GroupedCommon::kAlignmentD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<GroupedCommon::ElementD, float, void,
                                                   float>>::CollectiveOp;
  static constexpr int kEpilogueSmemBytes =
      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage));
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<kScaleM, kScaleN, 128, cute::GMMA::Major::K,
                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, GroupedCommon::ElementA,
      cute::tuple<GroupedCommon::LayoutA*, LayoutSFA*>, GroupedCommon::kAlignmentAB,
      GroupedCommon::ElementB, cute::tuple<GroupedCommon::LayoutB*, LayoutSFB*>,
      GroupedCommon::kAlignmentAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmemBytes>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupedCommon::ProblemShape,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename GroupedCommon::ProblemShape::UnderlyingProblemShape;
};

// The row (kScaleN 1) and block (kScaleN 128) forms, rows first; the block form swapped
// (moe_fp8_cutlass_grouped_block_swap.cu).
template <int kScaleN>
using GroupedConfig = BlockwiseConfig<1, kScaleN, false>;
using BlockSwapConfig = BlockwiseConfig<128, 1, true>;

// The per-group arrays at the start of the workspace, each 128-byte aligned; CUTLASS's own after.
template <class Config>
struct GroupArrays {
  typename Config::Shape* shapes;
  const typename Config::ElementA** a;
  const typename Config::ElementB** b;
  const float** sfa;
  const float** sfb;
  typename Config::ElementD** d;
  typename Config::StrideA* stride_a;
  typename Config::StrideB* stride_b;
  typename Config::StrideD* stride_d;
  typename Config::LayoutSFA* layout_sfa;
  typename Config::LayoutSFB* layout_sfb;
};

inline constexpr size_t kAlign = 128;
inline size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Lays one array of `groups` elements per field out from `base` (null: only counts), each 128-byte
// aligned, in the order given; returns their bytes. Every form's per-group arguments use it.
template <class... T>
size_t LayOutArrays(int64_t groups, char* base, T**... fields) {
  size_t offset = 0;
  auto take = [&]<class U>(U** field) {
    *field = base == nullptr ? nullptr : reinterpret_cast<U*>(base + offset);
    offset += AlignUp(sizeof(U) * static_cast<size_t>(groups));
  };
  (take(fields), ...);
  return offset;
}
// The blockwise forms' arrays for `groups` groups.
template <class Config>
size_t LayOut(int64_t groups, char* base, GroupArrays<Config>* g) {
  return LayOutArrays(groups, base, &g->shapes, &g->a, &g->b, &g->sfa, &g->sfb, &g->d, &g->stride_a,
                      &g->stride_b, &g->stride_d, &g->layout_sfa, &g->layout_sfb);
}
// Whether the row form reads w_scales_wide (per-channel weights broadcast over the groups).
inline __host__ __device__ bool WideWeightScales(const MoeFp8CutlassGroupedArgs& args) {
  return args.block_scales == nullptr && args.w.groups != MoeFp8CutlassGroups(args.k);
}

// Expert e's codes and (row or scaled form) scales: the device tables', or the single weight's.
inline __device__ const uint8_t* ExpertCodes(const MoeFp8CutlassGroupedArgs& args, int64_t e) {
  return args.single_codes != nullptr ? args.single_codes : args.w.codes[e];
}
inline __device__ const float* ExpertScales(const MoeFp8CutlassGroupedArgs& args, int64_t e) {
  return args.single_scales != nullptr ? args.single_scales : args.w.scales[e];
}

// The scale copies before the GEMM, each thread a stride of them: the block form's compact block
// scales (block_scale_ld != groups = ceil(k / 128)) into compact [num_experts, ceil(n / 128),
// groups]; per-token or per-tensor activation scales into a_scales_wide [rows, k / 128];
// per-channel weight scales into w_scales_wide [num_experts, n, k / 128] (experts without rows
// skipped: never read).
template <class Config>
__device__ void CopyScales(const MoeFp8CutlassGroupedArgs& args, float* compact) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = MoeFp8CutlassGroups(args.k);
  if constexpr (Config::kBlockScales) {
    if (compact != nullptr) {
      const int64_t per_expert = (args.n + 127) / 128 * groups;
      const int64_t total = args.num_experts * per_expert;
      for (int64_t i = first; i < total; i += stride) {
        const int64_t x = i / per_expert, b = i % per_expert / groups, c = i % groups;
        compact[i] = args.block_scales[x][b * args.block_scale_ld + c];
      }
    }
  }
  if (args.a_scheme != Fp8ActivationScheme::kDynamicGroup128) {
    const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
    const int64_t total = int64_t{args.expert_offsets[args.num_experts]} * groups;
    for (int64_t i = first; i < total; i += stride) {
      args.a_scales_wide[i] = args.a_scales[per_row ? i / groups : 0];
    }
  }
  if (WideWeightScales(args)) {
    const int64_t per_expert = args.n * groups, total = args.num_experts * per_expert;
    for (int64_t i = first; i < total; i += stride) {
      const int64_t x = i / per_expert;
      if (args.expert_offsets[x + 1] == args.expert_offsets[x]) continue;
      args.w_scales_wide[i] = ExpertScales(args, x)[i % per_expert / groups];
    }
  }
}

// Threads [0, num_experts): expert e's problem shape (m_e, n, k), operand pointers, strides and
// scale layouts from the device offsets (no host sync), after every thread's share of CopyScales.
template <class Config>
__global__ void FillGroups(MoeFp8CutlassGroupedArgs args, GroupArrays<Config> g, float* compact) {
  CopyScales<Config>(args, compact);
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t groups = MoeFp8CutlassGroups(args.k);
  const int64_t n_blocks = (args.n + 127) / 128;
  if (e >= args.num_experts) return;
  const int64_t first = args.expert_offsets[e];
  const int m = args.expert_offsets[e + 1] - args.expert_offsets[e];
  const int n = static_cast<int>(args.n), k = static_cast<int>(args.k);
  const auto* rows = reinterpret_cast<const typename Config::ElementA*>(args.a + first * args.k);
  const auto* weight = reinterpret_cast<const typename Config::ElementB*>(ExpertCodes(args, e));
  const bool wide_a = args.a_scheme != Fp8ActivationScheme::kDynamicGroup128;
  const float* row_scales = (wide_a ? args.a_scales_wide : args.a_scales) + first * groups;
  const float* weight_scales = nullptr;
  if constexpr (Config::kBlockScales) {
    weight_scales = compact != nullptr ? compact + e * n_blocks * groups : args.block_scales[e];
  } else {
    weight_scales =
        WideWeightScales(args) ? args.w_scales_wide + e * args.n * groups : ExpertScales(args, e);
  }
  g.d[e] = reinterpret_cast<typename Config::ElementD*>(args.out + first * args.n);
  typename Config::StrideA sa{};
  cute::get<0>(sa) = args.k;
  g.stride_a[e] = sa;
  typename Config::StrideB sb{};
  cute::get<0>(sb) = args.k;
  g.stride_b[e] = sb;
  typename Config::StrideD sd{};
  if constexpr (Config::kSwap) {  // the weight first: D^T [n, m_e], column-major
    g.shapes[e] = typename Config::Shape(n, m, k);
    g.a[e] = weight;
    g.b[e] = rows;
    g.sfa[e] = weight_scales;
    g.sfb[e] = row_scales;
    cute::get<1>(sd) = args.n;
  } else {
    g.shapes[e] = typename Config::Shape(m, n, k);
    g.a[e] = rows;
    g.b[e] = weight;
    g.sfa[e] = row_scales;
    g.sfb[e] = weight_scales;
    cute::get<0>(sd) = args.n;
  }
  g.stride_d[e] = sd;
  const auto shape = Config::kSwap ? cute::make_shape(n, m, k, 1) : cute::make_shape(m, n, k, 1);
  g.layout_sfa[e] = Config::ScaleConfig::tile_atom_to_shape_SFA(shape);
  g.layout_sfb[e] = Config::ScaleConfig::tile_atom_to_shape_SFB(shape);
}

template <class Config>
typename Config::Gemm::Arguments MakeArguments(int64_t groups, const GroupArrays<Config>& g,
                                               int device, int sm_count) {
  typename Config::Gemm::Arguments args{
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

inline absl::Status CheckCutlass(cutlass::Status status, absl::string_view what,
                                 absl::string_view form = "") {
  if (status == cutlass::Status::kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUTLASS grouped FP8 MoE GEMM: ", what, form, ": ",
                                          cutlass::cutlassGetStatusString(status)));
}

// Checks, initializes (CUTLASS's workspace after the per-group arrays) and launches `args` on
// `stream`; `form` is added to what an error names.
template <class Gemm>
absl::Status LaunchGemm(const typename Gemm::Arguments& args, char* gemm_workspace,
                        cudaStream_t stream, absl::string_view form = "") {
  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  if (can != cutlass::Status::kSuccess) return CheckCutlass(can, "can_implement", form);
  const cutlass::Status init = gemm.initialize(args, gemm_workspace, stream);
  if (init != cutlass::Status::kSuccess) return CheckCutlass(init, "initialize", form);
  return CheckCutlass(gemm.run(stream), "run", form);
}

template <class Config>
size_t WorkspaceBytes(int64_t groups, int device, int sm_count) {
  GroupArrays<Config> g{};
  const size_t arrays = LayOut(groups, nullptr, &g);
  return arrays + AlignUp(Config::Gemm::get_workspace_size(
                      MakeArguments<Config>(groups, g, device, sm_count)));
}

// The kernel's shared-memory opt-in (`form` named in an error).
template <class Config>
absl::Status Init(absl::string_view form = "") {
  using Kernel = typename Config::Kernel;
  const cudaError_t err =
      cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("MoeFp8CutlassGroupedGemm: shared-memory opt-in", form,
                                            ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

template <class Config>
absl::Status Run(const MoeFp8CutlassGroupedArgs& args, char* workspace, float* compact, int device,
                 int sm_count, cudaStream_t stream) {
  GroupArrays<Config> g{};
  const size_t arrays = LayOut(args.num_experts, workspace, &g);
  constexpr int kThreads = 128;
  int64_t blocks = (args.num_experts + kThreads - 1) / kThreads;
  // Enough threads for the scale copies, at most ~2 waves of small blocks (the activation rows
  // are on the device only: 1024 blocks whenever they are broadcast).
  int64_t total = 0;
  const int64_t groups = MoeFp8CutlassGroups(args.k);
  if (compact != nullptr) total = args.num_experts * ((args.n + 127) / 128) * groups;
  if (WideWeightScales(args)) total = std::max(total, args.num_experts * args.n * groups);
  if (args.a_scheme != Fp8ActivationScheme::kDynamicGroup128) total = int64_t{1024} * kThreads;
  blocks = std::max(blocks, std::min<int64_t>((total + kThreads - 1) / kThreads, 1024));
  FillGroups<Config><<<static_cast<int>(blocks), kThreads, 0, stream>>>(args, g, compact);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return LaunchGemm<typename Config::Gemm>(
      MakeArguments<Config>(args.num_experts, g, device, sm_count), workspace + arrays, stream);
}

}  // namespace tandem::kernels::cuda::moe_cutlass

#endif  // TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_KERNEL_CUH_
