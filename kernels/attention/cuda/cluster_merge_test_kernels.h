// Test-only launchers for cluster_merge_cuda_test: ClusterMergeSplits (cluster_merge.cuh) on
// partials given in global memory, and MergeSplitsKernel (paged_decode_merge.cuh), the merge its
// rows and LSEs must equal bit for bit.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_TEST_KERNELS_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_TEST_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace tandem::kernels::cuda::cluster_merge_test {

// part_o: [num_splits][rows][d] fp32, part_lse: [num_splits][rows] (device); out: [rows][d] bf16,
// lse: [rows]. d: 64, 128 or 512; rows <= 16; num_splits 2..16.
// One cluster of num_splits CTAs of `threads` threads: CTA s copies split s's partial into its
// shared memory and every CTA calls ClusterMergeSplits.
cudaError_t ClusterMerge(const float* part_o, const float* part_lse, int num_splits, int rows,
                         int d, int threads, __nv_bfloat16* out, float* lse);
// MergeSplitsKernel on the same partials.
cudaError_t SeparateMerge(const float* part_o, const float* part_lse, int num_splits, int rows,
                          int d, __nv_bfloat16* out, float* lse);

}  // namespace tandem::kernels::cuda::cluster_merge_test

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_CLUSTER_MERGE_TEST_KERNELS_H_
