// Internal to :moe_fp8_cutlass_grouped: the epilogue-scaled form (moe_fp8_cutlass_grouped.h,
// "scaled form") as a template over the operand order, included by one .cu file per order
// (moe_fp8_cutlass_grouped_scaled.cu, moe_fp8_cutlass_grouped_swap.cu).
//
// Per-channel weight scales (w.groups == 1) with per-token or static per-tensor activation scales
// are constant along k, so the mainloop needs none: CUTLASS's plain FP8 ptr-array grouped kernel
// (KernelPtrArrayTmaWarpSpecializedCooperative on e4m3: the wgmma partial sums promoted into fp32
// every 128 along k, as cuBLASLt without FAST_ACCUM) and an epilogue visitor tree that multiplies
// each fp32 sum by its weight row's scale and its activation row's (per token, or one value where
// static: the broadcast's dynamic stride 0), rounded once to bf16. CUTLASS 4.2's row and column
// broadcast nodes read per-group pointer arrays. vLLM runs this design for the same schemes
// (cutlass_moe_mm, with its swap_ab for few rows).
//
//   kSwap false: D [m_e, n] = A (the expert's rows) x B^T (its weight), 128 x 128 x 128 tiles,
//     clusters of 1 x 2 (as the other forms): prefill-sized groups;
//   kSwap true: D^T [n, m_e] = W x rows^T, the weight as the 128-row operand and the group's rows
//     as a kTokens-wide one (128 x kTokens x 128 tiles, no cluster; kTokens 32, or 64 for one
//     weight's 33-64 and 129-192 decode rows: fewer re-reads of a weight tile), D written
//     column-major
//     (= [m_e, n] row-major): groups of a few rows (decode) no longer fill 128-row tiles with
//     padding, so more stages of weight are in flight per SM.
#ifndef TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_SCALED_CUH_
#define TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_SCALED_CUH_

#include <type_traits>

#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {

template <bool kSwap, int kTokens = 32>
struct ScaledForm {
  static_assert(kTokens == 32 || (kSwap && kTokens == 64));
  using C = GroupedCommon;
  using _0 = cute::_0;
  using TileShape =
      std::conditional_t<kSwap, cute::Shape<cute::_128, cute::Int<kTokens>, cute::_128>,
                         typename GroupedTiles<false>::TileShape>;
  using ClusterShape = typename GroupedTiles<kSwap>::ClusterShape;
  using LayoutD = typename GroupedTiles<kSwap>::LayoutD;

  // The weight scales [n] and the activation scales (per token [m_e], or [0] on every row) of a
  // group: kSwap false, a row vector (over D's columns) and a column vector (over its rows); kSwap
  // true, the other way round.
  using RowScales = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float*, float,
                                                                cute::Stride<_0, bool, _0>>;
  using ColScales = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float*, float,
                                                                cute::Stride<bool, _0, _0>>;
  using WeightScales = std::conditional_t<kSwap, ColScales, RowScales>;
  using ActScales = std::conditional_t<kSwap, RowScales, ColScales>;
  template <class Out>
  using Times = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, Out, float,
                                                       cutlass::FloatRoundStyle::round_to_nearest>;
  // bf16((acc * weight scale) * activation scale).
  using AccTimesWeight =
      cutlass::epilogue::fusion::Sm90EVT<Times<float>, WeightScales,
                                         cutlass::epilogue::fusion::Sm90AccFetch>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<Times<C::ElementD>, ActScales, AccTimesWeight>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, C::ElementAccumulator, C::ElementAccumulator,
      void, LayoutD*, C::kAlignmentD, C::ElementD, LayoutD*, C::kAlignmentD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Scaled>::CollectiveOp;
  static constexpr int kEpilogueSmemBytes =
      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage));
  // Both orders take a row-major [rows, k] A and a K-major B (CUTLASS's column-major K x N): the
  // activations and the weight, or the weight and the activations.
  using CollectiveMainloop = PlainFp8Mainloop<TileShape, ClusterShape, kEpilogueSmemBytes>;

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

  static size_t LayOut(int64_t groups, char* base, Arrays* g) {
    return LayOutArrays(groups, base, &g->shapes, &g->a, &g->b, &g->sa, &g->sw, &g->d, &g->stride_a,
                        &g->stride_b, &g->stride_d);
  }

  static typename Gemm::Arguments MakeArguments(int64_t groups, const Arrays& g, bool per_row,
                                                int device, int sm_count,
                                                bool along_tokens = false) {
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {static_cast<int>(groups), g.shapes, nullptr},
                                  {g.a, g.stride_a, g.b, g.stride_b},
                                  {{}, nullptr, g.stride_d, g.d, g.stride_d}};
    typename ActScales::Arguments act{g.sa, 0.0f, {}};
    typename WeightScales::Arguments weight{g.sw, 0.0f, {}};
    // The dynamic broadcast flags: activations per token or one value, weights per row.
    if constexpr (kSwap) {
      act.dRow = {_0{}, per_row, _0{}};
      weight.dCol = {true, _0{}, _0{}};
    } else {
      act.dCol = {per_row, _0{}, _0{}};
      weight.dRow = {_0{}, true, _0{}};
    }
    args.epilogue.thread = {act, {weight, {}, {}}, {}};
    // Swapped, where the caller asks: a weight tile's token tiles next to each other
    // (MoeFp8CutlassGroupedArgs::raster_along_tokens).
    if (kSwap && along_tokens) {
      args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongN;
    }
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static size_t WorkspaceBytes(int64_t groups, int device, int sm_count) {
    Arrays g{};
    const size_t arrays = LayOut(groups, nullptr, &g);
    return arrays +
           AlignUp(Gemm::get_workspace_size(MakeArguments(groups, g, true, device, sm_count)));
  }

  static absl::Status Init() { return moe_cutlass::Init<ScaledForm>(Name()); }

  static const char* Name() {
    return !kSwap          ? " (scaled form)"
           : kTokens == 32 ? " (scaled form, swapped)"
                           : " (scaled form, swapped, 64-row token tiles)";
  }

  static absl::Status Run(const MoeFp8CutlassGroupedArgs& args, char* workspace, int device,
                          int sm_count, cudaStream_t stream);
};

// Thread e < num_experts: expert e's shape, operands and scale pointers from the device offsets.
template <bool kSwap, int kTokens>
__global__ void FillScaledGroups(MoeFp8CutlassGroupedArgs args,
                                 typename ScaledForm<kSwap, kTokens>::Arrays g) {
  using F = ScaledForm<kSwap, kTokens>;
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= args.num_experts) return;
  const int64_t first = args.expert_offsets[e];
  const int m = args.expert_offsets[e + 1] - args.expert_offsets[e];
  const int n = static_cast<int>(args.n), k = static_cast<int>(args.k);
  const auto* rows = reinterpret_cast<const typename F::C::ElementA*>(args.a + first * args.k);
  const auto* weight = reinterpret_cast<const typename F::C::ElementB*>(ExpertCodes(args, e));
  if constexpr (kSwap) {
    g.shapes[e] = typename F::Shape(n, m, k);
    g.a[e] = reinterpret_cast<const typename F::C::ElementA*>(weight);
    g.b[e] = reinterpret_cast<const typename F::C::ElementB*>(rows);
  } else {
    g.shapes[e] = typename F::Shape(m, n, k);
    g.a[e] = rows;
    g.b[e] = weight;
  }
  const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
  g.sa[e] = per_row ? args.a_scales + first : args.a_scales;
  g.sw[e] = ExpertScales(args, e);
  g.d[e] = reinterpret_cast<typename F::C::ElementD*>(args.out + first * args.n);
  typename F::StrideA sa{};
  cute::get<0>(sa) = args.k;
  g.stride_a[e] = sa;
  typename F::StrideB sb{};
  cute::get<0>(sb) = args.k;
  g.stride_b[e] = sb;
  typename F::StrideD sd{};
  if constexpr (kSwap) {
    cute::get<1>(sd) = args.n;  // column-major [n, m_e]: columns n apart
  } else {
    cute::get<0>(sd) = args.n;
  }
  g.stride_d[e] = sd;
}

template <bool kSwap, int kTokens>
absl::Status ScaledForm<kSwap, kTokens>::Run(const MoeFp8CutlassGroupedArgs& args, char* workspace,
                                             int device, int sm_count, cudaStream_t stream) {
  Arrays g{};
  const size_t arrays = LayOut(args.num_experts, workspace, &g);
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((args.num_experts + kThreads - 1) / kThreads);
  FillScaledGroups<kSwap, kTokens><<<blocks, kThreads, 0, stream>>>(args, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
  return LaunchGemm<Gemm>(
      MakeArguments(args.num_experts, g, per_row, device, sm_count, args.raster_along_tokens),
      workspace + arrays, stream, Name());
}

}  // namespace tandem::kernels::cuda::moe_cutlass

#endif  // TANDEM_KERNELS_MOE_CUTLASS_MOE_FP8_CUTLASS_GROUPED_SCALED_CUH_
