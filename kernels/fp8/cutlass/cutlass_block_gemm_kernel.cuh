// Internal to :cutlass_block_gemm: one CUTLASS sm90 block-scaled FP8 GEMM configuration as a
// type, and the host calls that run it (cutlass_block_gemm_config.h declares what each
// instantiating .cu file defines; one configuration per .cu file, so nvcc compiles them in
// parallel). CUTLASS's own types stay inside the .cu files: the public header includes none.
#ifndef TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_KERNEL_CUH_
#define TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_KERNEL_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "kernels/fp8/cutlass/cutlass_block_gemm_config.h"

namespace tandem::kernels::cuda::cutlass_block {

// D[m, n] bf16 = A[m, k] e4m3 (row-major) x B^T, B = the weight [n, k] e4m3 row-major (CUTLASS's
// column-major K x N), scales per (1 row, 128 columns) of A, read M-major ([groups, m]: what
// CUTLASS loads by TMA), and per (128 rows, 128 columns) block of the weight, read K-major
// ([n blocks, ld]). No C operand (beta = 0, nothing read). fp32 accumulation, promoted per
// 128-column group with its scales (ScalePromotionInterval = the tile's k).
template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct BlockGemmConfig {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignmentAB = 16;  // elements: 16 bytes, TMA's minimum
  static constexpr int kAlignmentD = 8;    // 16 bytes of bf16

  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void,
      LayoutD, kAlignmentD, ElementD, LayoutD, kAlignmentD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void,
                                                   ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA, LayoutSFA>, kAlignmentAB, ElementB, cute::tuple<LayoutB, LayoutSFB>,
      kAlignmentAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  // The persistent tile scheduler (void): every output tile on one CTA, no split k, so the
  // result does not depend on the grid.
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Config>
typename Config::Gemm::Arguments MakeArguments(const Problem& p) {
  using Gemm = typename Config::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  using LayoutSFA = typename Config::LayoutSFA;
  using LayoutSFB = typename Config::LayoutSFB;
  const int m = static_cast<int>(p.m);
  const int n = static_cast<int>(p.n);
  const int k = static_cast<int>(p.k);
  const int groups = k / 128;
  const int n_blocks = (n + 127) / 128;
  const int a_ld = static_cast<int>(p.a_scale_ld);
  const int w_ld = static_cast<int>(p.w_scale_ld);
  // Row-major A [m, k], the weight [n, k], D [m, n]; batch stride unused (l = 1).
  StrideA stride_a{};
  cute::get<0>(stride_a) = k;
  cute::get<2>(stride_a) = int64_t{m} * k;
  StrideB stride_b{};
  cute::get<0>(stride_b) = k;
  cute::get<2>(stride_b) = int64_t{n} * k;
  StrideD stride_d{};
  cute::get<0>(stride_d) = n;
  cute::get<2>(stride_d) = int64_t{m} * n;
  // Scale layouts ((1, rows), (128, groups), l): the activation scales' rows are a_ld (m
  // rounded up to 4) long, so the TMA box's stride is 16-byte aligned; the weight's are w_ld.
  const LayoutSFA layout_sfa =
      cute::make_layout(cute::make_shape(cute::make_shape(cute::Int<1>{}, a_ld),
                                         cute::make_shape(cute::Int<128>{}, groups), 1),
                        cute::make_stride(cute::make_stride(cute::Int<0>{}, cute::Int<1>{}),
                                          cute::make_stride(cute::Int<0>{}, a_ld), a_ld * groups));
  const LayoutSFB layout_sfb = cute::make_layout(
      cute::make_shape(cute::make_shape(cute::Int<128>{}, n_blocks),
                       cute::make_shape(cute::Int<128>{}, groups), 1),
      cute::make_stride(cute::make_stride(cute::Int<0>{}, w_ld),
                        cute::make_stride(cute::Int<0>{}, cute::Int<1>{}), n_blocks * w_ld));
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {reinterpret_cast<const typename Config::ElementA*>(p.a), stride_a,
       reinterpret_cast<const typename Config::ElementB*>(p.w), stride_b, p.a_scales, layout_sfa,
       p.w_scales, layout_sfb},
      {{}, nullptr, stride_d, reinterpret_cast<typename Config::ElementD*>(p.out), stride_d}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.hw_info.device_id = p.device;
  args.hw_info.sm_count = p.sm_count;
  using RasterOptions = typename Config::Kernel::TileScheduler::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle;
  args.scheduler.raster_order = p.raster == 1   ? RasterOptions::AlongM
                                : p.raster == 2 ? RasterOptions::AlongN
                                                : RasterOptions::Heuristic;
  return args;
}

inline absl::Status CheckCutlass(cutlass::Status status, const char* what) {
  if (status == cutlass::Status::kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUTLASS block FP8 GEMM: ", what, ": ",
                                          cutlass::cutlassGetStatusString(status)));
}

template <class Config>
size_t WorkspaceBytes(const Problem& p) {
  return Config::Gemm::get_workspace_size(MakeArguments<Config>(p));
}

template <class Config>
absl::Status Init() {
  using Kernel = typename Config::Kernel;
  const cudaError_t err =
      cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize);
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("CUTLASS block FP8 GEMM: shared-memory opt-in: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

template <class Config>
absl::Status Run(const Problem& p, void* workspace, cudaStream_t stream) {
  using Gemm = typename Config::Gemm;
  const typename Gemm::Arguments args = MakeArguments<Config>(p);
  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  if (can != cutlass::Status::kSuccess) return CheckCutlass(can, "can_implement");
  const cutlass::Status init = gemm.initialize(args, workspace, stream);
  if (init != cutlass::Status::kSuccess) return CheckCutlass(init, "initialize");
  return CheckCutlass(gemm.run(stream), "run");
}

}  // namespace tandem::kernels::cuda::cutlass_block

#endif  // TANDEM_KERNELS_FP8_CUTLASS_CUTLASS_BLOCK_GEMM_KERNEL_CUH_
