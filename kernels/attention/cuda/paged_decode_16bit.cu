// Decode kernels for bf16 / fp16 KV (the activations' own type), bf16 and fp16 activations (see
// paged_decode_launch.cuh).
#include "kernels/attention/cuda/paged_decode_launch.cuh"

namespace tandem::kernels::cuda::internal {

template absl::Status LaunchPagedDecode<__nv_bfloat16, __nv_bfloat16>(
    const DecodeParams<__nv_bfloat16>&, const PagedAttentionPlan&, cudaStream_t);
template absl::Status LaunchPagedDecode<__half, __half>(const DecodeParams<__half>&,
                                                        const PagedAttentionPlan&, cudaStream_t);

template absl::StatusOr<int> MaxActiveDecodeClusters<__nv_bfloat16, __nv_bfloat16>(int64_t, int);
template absl::StatusOr<int> MaxActiveDecodeClusters<__half, __half>(int64_t, int);

}  // namespace tandem::kernels::cuda::internal
