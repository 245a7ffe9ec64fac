// Decode kernels for int8 KV with per-token scales, bf16 and fp16 activations (see
// paged_decode_launch.cuh).
#include "kernels/attention/cuda/paged_decode_launch.cuh"

namespace tandem::kernels::cuda::internal {

template absl::Status LaunchPagedDecode<__nv_bfloat16, int8_t>(const DecodeParams<__nv_bfloat16>&,
                                                               const PagedAttentionPlan&,
                                                               cudaStream_t);
template absl::Status LaunchPagedDecode<__half, int8_t>(const DecodeParams<__half>&,
                                                        const PagedAttentionPlan&, cudaStream_t);

template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, int8_t>(int64_t, int);

}  // namespace tandem::kernels::cuda::internal
