// The swapped scaled form split along k (moe_fp8_cutlass_grouped.h, k_splits): one weight's
// product as S groups of CUTLASS's plain FP8 ptr-array grouped kernel, group s the k slice
// [s ks, (s + 1) ks) of the weight and of the rows (both read in place: the groups' strides stay
// k), each writing its fp32 partial sums D_s^T [n, m] column-major into args.split_partials; then
// one kernel adds the S partials in order, multiplies by the weight row's and the activation
// row's scales, adds the bias and rounds once to bf16. So a decode product whose weight has few
// 128-row tiles (Llama-3-8B's o and down: 32) still spreads over every SM.
#include <cuda_bf16.h>

#include "cutlass/epilogue/fusion/operations.hpp"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_config.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped_kernel.cuh"

namespace tandem::kernels::cuda::moe_cutlass {
namespace {

struct SplitForm {
  using C = GroupedCommon;
  using TileShape = GroupedTiles<true>::TileShape;
  using ClusterShape = GroupedTiles<true>::ClusterShape;
  using LayoutD = cutlass::layout::ColumnMajor;
  using ElementD = float;
  static constexpr int kAlignmentD = 4;  // 16 bytes of fp32

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignmentD,
      ElementD, LayoutD*, kAlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  static constexpr int kEpilogueSmemBytes =
      static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage));
  using CollectiveMainloop = PlainFp8Mainloop<TileShape, ClusterShape, kEpilogueSmemBytes>;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<C::ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename C::ProblemShape::UnderlyingProblemShape;

  struct Arrays {
    Shape* shapes;
    const C::ElementA** a;
    const C::ElementB** b;
    ElementD** d;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
  };

  static size_t LayOut(int64_t groups, char* base, Arrays* g) {
    return LayOutArrays(groups, base, &g->shapes, &g->a, &g->b, &g->d, &g->stride_a, &g->stride_b,
                        &g->stride_d);
  }

  static typename Gemm::Arguments MakeArguments(int64_t groups, const Arrays& g, int device,
                                                int sm_count) {
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {static_cast<int>(groups), g.shapes, nullptr},
                                  {g.a, g.stride_a, g.b, g.stride_b},
                                  {{}, nullptr, g.stride_d, g.d, g.stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    // The token tiles of one weight tile next to each other (> 32 rows: the weight tile's second
    // read from L2).
    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongN;
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static const char* Name() { return " (scaled form, swapped, split along k)"; }
};

// Thread s < slices: slice s's problem (n, m, its columns), operands and partial output.
__global__ void FillSplitGroups(MoeFp8CutlassGroupedArgs args, int64_t slice_cols, int slices,
                                SplitForm::Arrays g) {
  const int s = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (s >= slices) return;
  const int m = args.expert_offsets[1] - args.expert_offsets[0];
  const int64_t c0 = s * slice_cols;
  const int cols = static_cast<int>(args.k - c0 < slice_cols ? args.k - c0 : slice_cols);
  g.shapes[s] = SplitForm::Shape(static_cast<int>(args.n), m, cols);
  g.a[s] = reinterpret_cast<const SplitForm::C::ElementA*>(args.single_codes + c0);
  g.b[s] = reinterpret_cast<const SplitForm::C::ElementB*>(
      args.a + int64_t{args.expert_offsets[0]} * args.k + c0);
  g.d[s] = args.split_partials + s * int64_t{m} * args.n;
  SplitForm::StrideA sa{};
  cute::get<0>(sa) = args.k;
  g.stride_a[s] = sa;
  SplitForm::StrideB sb{};
  cute::get<0>(sb) = args.k;
  g.stride_b[s] = sb;
  SplitForm::StrideD sd{};
  cute::get<1>(sd) = args.n;  // column-major [n, m]: columns n apart
  g.stride_d[s] = sd;
}

// out[r, j] = bf16(((sum_s P_s[r, j]) * w_scales[j]) * a_scale[r] (+ bias[j])), 4 columns a
// thread (n % 4 == 0), the slices added in order.
__global__ void ReduceSplits(MoeFp8CutlassGroupedArgs args, int slices) {
  const int m = args.expert_offsets[1] - args.expert_offsets[0];
  const int64_t quads = int64_t{m} * args.n / 4;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= quads) return;
  const int64_t r = i * 4 / args.n, j = i * 4 % args.n;
  const int64_t plane = int64_t{m} * args.n;
  float4 acc = reinterpret_cast<const float4*>(args.split_partials)[i];
  for (int s = 1; s < slices; ++s) {
    const float4 p = reinterpret_cast<const float4*>(args.split_partials + s * plane)[i];
    acc.x += p.x, acc.y += p.y, acc.z += p.z, acc.w += p.w;
  }
  const bool per_row = args.a_scheme == Fp8ActivationScheme::kDynamicToken;
  const float sa = args.a_scales[per_row ? args.expert_offsets[0] + r : 0];
  const float4 sw = *reinterpret_cast<const float4*>(args.single_scales + j);
  float v[4] = {acc.x * sw.x * sa, acc.y * sw.y * sa, acc.z * sw.z * sa, acc.w * sw.w * sa};
  if (args.split_bias != nullptr) {
    for (int q = 0; q < 4; ++q) v[q] += __bfloat162float(args.split_bias[j + q]);
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
  __nv_bfloat16* out = args.out + (int64_t{args.expert_offsets[0]} + r) * args.n + j;
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = packed;
}

}  // namespace

size_t SplitWorkspaceBytes(int device, int sm_count) {
  SplitForm::Arrays g{};
  const size_t arrays = SplitForm::LayOut(kMoeFp8CutlassMaxSplits, nullptr, &g);
  return arrays + AlignUp(SplitForm::Gemm::get_workspace_size(
                      SplitForm::MakeArguments(kMoeFp8CutlassMaxSplits, g, device, sm_count)));
}

absl::Status SplitInit() { return moe_cutlass::Init<SplitForm>(SplitForm::Name()); }

absl::Status SplitRun(const MoeFp8CutlassGroupedArgs& args, int64_t rows, char* workspace,
                      int device, int sm_count, cudaStream_t stream) {
  const int64_t slice_cols = MoeFp8CutlassSplitCols(args.k, args.k_splits);
  const int slices = static_cast<int>((args.k + slice_cols - 1) / slice_cols);
  SplitForm::Arrays g{};
  const size_t arrays = SplitForm::LayOut(slices, workspace, &g);
  FillSplitGroups<<<1, 32, 0, stream>>>(args, slice_cols, slices, g);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  RETURN_IF_ERROR(LaunchGemm<SplitForm::Gemm>(SplitForm::MakeArguments(slices, g, device, sm_count),
                                              workspace + arrays, stream, SplitForm::Name()));
  constexpr int kThreads = 256;
  const int64_t quads = rows * args.n / 4;
  if (quads == 0) return absl::OkStatus();
  ReduceSplits<<<static_cast<unsigned>((quads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      args, slices);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda::moe_cutlass
