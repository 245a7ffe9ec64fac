// Decode kernels for fp8 e4m3 KV, bf16 and fp16 activations (see paged_decode_launch.cuh).
#include "kernels/attention/cuda/paged_decode_launch.cuh"

namespace tandem::kernels::cuda::internal {

template absl::Status LaunchPagedDecode<__nv_bfloat16, __nv_fp8_e4m3>(
    const DecodeParams<__nv_bfloat16>&, const PagedAttentionPlan&, cudaStream_t);
template absl::Status LaunchPagedDecode<__half, __nv_fp8_e4m3>(const DecodeParams<__half>&,
                                                               const PagedAttentionPlan&,
                                                               cudaStream_t);

template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, __nv_fp8_e4m3>(int64_t, int);

}  // namespace tandem::kernels::cuda::internal
