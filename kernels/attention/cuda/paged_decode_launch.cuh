// The launch side of cuda::PagedAttention (internal; included by paged_attention_cuda.cu and
// the paged_decode_*.cu files only): LaunchPagedDecode<T, KV> turns the plan's head_dim and
// rows-per-warp into template constants and launches the decode kernel (+ the split merge, unless
// the decode kernel merges the splits itself).
// Each (activation, KV) pair is instantiated in one .cu file (16bit, fp8, int8), so the kernels
// compile in parallel; the extern declarations below keep other files from instantiating them.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_LAUNCH_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_LAUNCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/cuda/paged_decode_kernel.cuh"
#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/attention/cuda/paged_decode_tc_kernel.cuh"

namespace tandem::kernels::cuda::internal {

// p: filled by PagedAttention (validated); plan: the PagedAttentionPlan it was checked against.
template <typename T, typename KV>
absl::Status LaunchPagedDecode(const DecodeParams<T>& p, const PagedAttentionPlan& plan,
                               cudaStream_t stream);

namespace decode_launch_detail {

template <typename... Args>
absl::Status LaunchInvalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("cuda::PagedAttention: ", args...));
}

// One decode grid: `kernel` with `smem` bytes of dynamic shared memory, PDL-launched when the
// plan says so (PagedAttentionPlanInput::programmatic_launch).
template <typename T>
absl::Status LaunchDecodeGrid(void (*kernel)(DecodeParams<T>), const DecodeParams<T>& p, dim3 grid,
                              int smem, bool pdl, cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const PdlLaunchConfig config(grid, dim3(kDecodeThreads), stream, pdl, static_cast<size_t>(smem));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), kernel, p));
  return absl::OkStatus();
}

// The cluster-merge decode grid (PagedAttentionPlan::cluster_merge): clusters of `cluster` CTAs
// along x (the grid's splits), with the PDL attribute when `pdl`. Only sets the kernel's
// attributes when `grid` is empty: cudaOccupancyMaxActiveClusters then asks about `cluster`,
// `smem` and the result goes to *max_clusters.
template <typename T>
absl::Status LaunchClusterDecodeGrid(void (*kernel)(DecodeParams<T>), const DecodeParams<T>& p,
                                     dim3 grid, int smem, int cluster, bool pdl,
                                     cudaStream_t stream, int* max_clusters = nullptr) {
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.gridDim = grid;
  config.blockDim = dim3(kDecodeThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = pdl ? 2 : 1;
  if (max_clusters != nullptr) {
    config.gridDim = dim3(static_cast<unsigned>(cluster));
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(max_clusters, kernel, &config));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p));
  return absl::OkStatus();
}

template <typename T, typename KV, int D, int RPW>
absl::Status LaunchCudaCore(const DecodeParams<T>& p, dim3 grid, bool pdl, cudaStream_t stream) {
  return LaunchDecodeGrid<T>(&PagedDecodeKernel<T, KV, D, RPW>, p, grid,
                             internal::DecodeCfg<KV, D>::kSmemBytes, pdl, stream);
}

template <typename T, typename KV, int D>
absl::Status LaunchDecode(const DecodeParams<T>& p, const PagedAttentionPlan& plan,
                          cudaStream_t stream) {
  const PagedAttentionPlanInput& in = plan.input;
  const bool pdl = in.programmatic_launch;
  const dim3 grid(static_cast<unsigned>(plan.num_splits),
                  static_cast<unsigned>(in.num_kv_heads * plan.row_tiles),
                  static_cast<unsigned>(in.num_seqs));
  if (plan.use_tensor_cores) {
    if constexpr (D == 64 || D == 128) {
      using Cfg = TcCfg<D, KV>;
      if (plan.cluster_merge) {
        RETURN_IF_ERROR(LaunchClusterDecodeGrid<T>(&PagedDecodeTcKernel<T, KV, D, true>, p, grid,
                                                   Cfg::kSmemBytes, plan.num_splits, pdl, stream));
      } else {
        RETURN_IF_ERROR(LaunchDecodeGrid<T>(&PagedDecodeTcKernel<T, KV, D>, p, grid,
                                            Cfg::kSmemBytes, pdl, stream));
      }
    } else {
      return LaunchInvalid("no tensor-core kernel for head_dim ", D, " / this KV dtype");
    }
  } else {
    switch (plan.rows_per_warp) {
      case 1:
        RETURN_IF_ERROR((LaunchCudaCore<T, KV, D, 1>(p, grid, pdl, stream)));
        break;
      case 2:
        if constexpr (D <= 128) {
          RETURN_IF_ERROR((LaunchCudaCore<T, KV, D, 2>(p, grid, pdl, stream)));
          break;
        }
        [[fallthrough]];
      case 4:
        if constexpr (D <= 64) {
          RETURN_IF_ERROR((LaunchCudaCore<T, KV, D, 4>(p, grid, pdl, stream)));
          break;
        }
        [[fallthrough]];
      default:
        return LaunchInvalid("no kernel for rows_per_warp ", plan.rows_per_warp, " at head_dim ",
                             D);
    }
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (plan.num_splits > 1 && !plan.merge_in_kernel && !plan.cluster_merge) {
    const int64_t rows = in.num_tokens * in.num_q_heads;
    const unsigned blocks = static_cast<unsigned>((rows + 3) / 4);
    if (in.legacy_split_merge) {
      CombineSplitsKernel<T, D>
          <<<blocks, 128, 0, stream>>>(p.part_o, p.part_lse, plan.num_splits, rows, p.out, p.lse);
      CUDA_RETURN_IF_ERROR(cudaGetLastError());
    } else {
      const PdlLaunchConfig config(dim3(blocks), dim3(128), stream, /*pdl=*/true);
      CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), MergeSplitsKernel<T, D>, p.part_o,
                                              p.part_lse, plan.num_splits, rows, p.out, p.lse));
    }
  }
  return absl::OkStatus();
}

}  // namespace decode_launch_detail

// Clusters of `cluster` cluster-merge tensor-core decode CTAs (head_dim 64 / 128) that can be
// resident at once on the current device (cudaOccupancyMaxActiveClusters; 0: none fit).
template <typename T, typename KV>
absl::StatusOr<int> MaxActiveDecodeClusters(int64_t head_dim, int cluster) {
  int n = 0;
  const DecodeParams<T> p{};
  if (head_dim == 64) {
    RETURN_IF_ERROR(decode_launch_detail::LaunchClusterDecodeGrid<T>(
        &PagedDecodeTcKernel<T, KV, 64, true>, p, dim3(0), TcCfg<64, KV>::kSmemBytes, cluster,
        false, nullptr, &n));
  } else if (head_dim == 128) {
    RETURN_IF_ERROR(decode_launch_detail::LaunchClusterDecodeGrid<T>(
        &PagedDecodeTcKernel<T, KV, 128, true>, p, dim3(0), TcCfg<128, KV>::kSmemBytes, cluster,
        false, nullptr, &n));
  }
  return n;
}

template <typename T, typename KV>
absl::Status LaunchPagedDecode(const DecodeParams<T>& p, const PagedAttentionPlan& plan,
                               cudaStream_t stream) {
  using decode_launch_detail::LaunchDecode;
  using decode_launch_detail::LaunchInvalid;
  switch (plan.input.head_dim) {
    case 16:
      return LaunchDecode<T, KV, 16>(p, plan, stream);
    case 32:
      return LaunchDecode<T, KV, 32>(p, plan, stream);
    case 64:
      return LaunchDecode<T, KV, 64>(p, plan, stream);
    case 128:
      return LaunchDecode<T, KV, 128>(p, plan, stream);
    case 256:
      return LaunchDecode<T, KV, 256>(p, plan, stream);
    default:
      return LaunchInvalid("head_dim ", plan.input.head_dim,
                           " not supported (16, 32, 64, 128, 256)");
  }
}

extern template absl::Status LaunchPagedDecode<__nv_bfloat16, __nv_bfloat16>(
    const DecodeParams<__nv_bfloat16>&, const PagedAttentionPlan&, cudaStream_t);
extern template absl::Status LaunchPagedDecode<__half, __half>(const DecodeParams<__half>&,
                                                               const PagedAttentionPlan&,
                                                               cudaStream_t);
extern template absl::Status LaunchPagedDecode<__nv_bfloat16, __nv_fp8_e4m3>(
    const DecodeParams<__nv_bfloat16>&, const PagedAttentionPlan&, cudaStream_t);
extern template absl::Status LaunchPagedDecode<__half, __nv_fp8_e4m3>(const DecodeParams<__half>&,
                                                                      const PagedAttentionPlan&,
                                                                      cudaStream_t);
extern template absl::Status LaunchPagedDecode<__nv_bfloat16, int8_t>(
    const DecodeParams<__nv_bfloat16>&, const PagedAttentionPlan&, cudaStream_t);
extern template absl::Status LaunchPagedDecode<__half, int8_t>(const DecodeParams<__half>&,
                                                               const PagedAttentionPlan&,
                                                               cudaStream_t);

extern template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, __nv_bfloat16>(int64_t,
                                                                                          int);
extern template absl::StatusOr<int> MaxActiveDecodeClusters<__half, __half>(int64_t, int);
extern template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, __nv_fp8_e4m3>(int64_t,
                                                                                          int);
extern template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, int8_t>(int64_t, int);

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_LAUNCH_CUH_
