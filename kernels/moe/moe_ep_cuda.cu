// MoeLocalizeRouting (moe_ep_cuda.h).
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/moe/moe_ep_cuda.h"

namespace tandem::kernels::cuda {
namespace {

__global__ void LocalizeKernel(int32_t* ids, float* weights, int64_t pairs, const int32_t* slots,
                               int32_t num_local, unsigned long long* load) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= pairs) return;
  const int32_t e = ids[p];
  if (load != nullptr) atomicAdd(load + e, 1ull);
  const int32_t slot = slots[e];
  ids[p] = slot >= 0 ? slot : num_local;
  if (slot < 0) weights[p] = 0.0f;
}

}  // namespace

absl::Status MoeLocalizeRouting(int32_t* ids, float* weights, int64_t num_pairs,
                                const int32_t* slot_of_expert, int64_t num_experts,
                                int64_t num_local, int64_t* global_load, cudaStream_t stream) {
  if (num_local < 0 || num_experts < 1 || num_pairs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MoeLocalizeRouting: ", num_pairs, " pairs, ",
                                                   num_local, " of ", num_experts, " experts"));
  }
  if (num_pairs == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((num_pairs + kThreads - 1) / kThreads);
  static_assert(sizeof(unsigned long long) == sizeof(int64_t));
  LocalizeKernel<<<blocks, kThreads, 0, stream>>>(
      ids, weights, num_pairs, slot_of_expert, static_cast<int32_t>(num_local),
      reinterpret_cast<unsigned long long*>(global_load));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
