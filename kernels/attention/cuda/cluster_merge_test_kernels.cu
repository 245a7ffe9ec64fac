// Test-only launchers of cluster_merge_test_kernels.h.
#include <cstdint>

#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/cluster_merge_test_kernels.h"
#include "kernels/attention/cuda/paged_decode_merge.cuh"

namespace tandem::kernels::cuda::cluster_merge_test {
namespace {

using internal::ClusterMergeSmemFloats;

struct Identity {
  __device__ int64_t operator()(int rr) const { return rr; }
};

// Dynamic shared memory: the partial [rows][D], its LSEs [rows], then the merge's scratch.
template <int D>
__global__ void ClusterMergeKernel(const float* part_o, const float* part_lse, int rows,
                                   __nv_bfloat16* out, float* lse) {
  extern __shared__ float4 smem4[];
  float* o = reinterpret_cast<float*>(smem4);
  float* l = o + rows * D;
  const int s = blockIdx.x;
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) o[i] = part_o[s * rows * D + i];
  for (int i = threadIdx.x; i < rows; i += blockDim.x) l[i] = part_lse[s * rows + i];
  internal::ClusterMergeSplits<__nv_bfloat16, D>(o, l, rows, Identity(), out, lse, l + rows);
}

template <int D>
cudaError_t LaunchCluster(const float* part_o, const float* part_lse, int num_splits, int rows,
                          int threads, __nv_bfloat16* out, float* lse) {
  const size_t smem = (rows * (D + 1) + ClusterMergeSmemFloats(rows, num_splits)) * 4;
  cudaError_t e = cudaFuncSetAttribute(ClusterMergeKernel<D>,
                                       cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(ClusterMergeKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(num_splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.gridDim = dim3(static_cast<unsigned>(num_splits));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, ClusterMergeKernel<D>, part_o, part_lse, rows, out, lse);
}

template <int D>
cudaError_t LaunchSeparate(const float* part_o, const float* part_lse, int num_splits, int rows,
                           __nv_bfloat16* out, float* lse) {
  internal::MergeSplitsKernel<__nv_bfloat16, D>
      <<<(rows + 3) / 4, 128>>>(part_o, part_lse, num_splits, rows, out, lse);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ClusterMerge(const float* part_o, const float* part_lse, int num_splits, int rows,
                         int d, int threads, __nv_bfloat16* out, float* lse) {
  switch (d) {
    case 64:
      return LaunchCluster<64>(part_o, part_lse, num_splits, rows, threads, out, lse);
    case 128:
      return LaunchCluster<128>(part_o, part_lse, num_splits, rows, threads, out, lse);
    case 512:
      return LaunchCluster<512>(part_o, part_lse, num_splits, rows, threads, out, lse);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t SeparateMerge(const float* part_o, const float* part_lse, int num_splits, int rows,
                          int d, __nv_bfloat16* out, float* lse) {
  switch (d) {
    case 64:
      return LaunchSeparate<64>(part_o, part_lse, num_splits, rows, out, lse);
    case 128:
      return LaunchSeparate<128>(part_o, part_lse, num_splits, rows, out, lse);
    case 512:
      return LaunchSeparate<512>(part_o, part_lse, num_splits, rows, out, lse);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::kernels::cuda::cluster_merge_test
