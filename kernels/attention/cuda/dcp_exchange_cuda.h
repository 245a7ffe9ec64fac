// CUDA twin of kernels/attention/dcp_exchange.h: pack a rank's shard-attention result into the
// DCP all-to-all buffer, and unpack + N-way merge the received buffer, in the wire layout that
// header documents (DcpExchangeLayout; elem_bytes = sizeof(T)). The all-to-all itself (NCCL) is
// the caller's: one buffer of layout.BufferBytes() each way.
//
// Thread safety: asynchronous on `stream`; writes only the output buffer.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_DCP_EXCHANGE_CUDA_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_DCP_EXCHANGE_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/attention/dcp_exchange.h"

namespace tandem::kernels::cuda {

// out: [num_tokens, num_heads, head_dim] of T (PagedAttention's, device); lse: [num_tokens,
// num_heads] fp32 (device); send: layout.BufferBytes() device bytes. Region j gets heads
// [j * HeadsPerRank(), (j + 1) * HeadsPerRank()) of every token, then their lse; padding is not
// written. One thread per 16-byte vector (and per lse value). INVALID_ARGUMENT (nothing
// launched) on an invalid layout, elem_bytes != sizeof(T), head_dim * sizeof(T) not a multiple
// of 16, null pointers (when num_tokens > 0), or out / send not 16-byte aligned.
template <typename T>
absl::Status DcpPackForExchange(const T* out, const float* lse, const DcpExchangeLayout& layout,
                                void* send, cudaStream_t stream);

// recv: the received layout.BufferBytes() device bytes (region k from rank k), 16-byte aligned;
// out: [num_tokens, HeadsPerRank(), head_dim] of T; lse: [num_tokens, HeadsPerRank()] fp32 or
// null. MergeAttnStatesN straight over the regions (DcpReceivedPartials): no unpack copy. Empty
// shards (lse -inf) contribute nothing; all empty gives 0 / -inf. Errors as DcpPackForExchange.
template <typename T>
absl::Status DcpMergeReceived(const void* recv, const DcpExchangeLayout& layout, T* out, float* lse,
                              cudaStream_t stream);

extern template absl::Status DcpPackForExchange<float>(const float*, const float*,
                                                       const DcpExchangeLayout&, void*,
                                                       cudaStream_t);
extern template absl::Status DcpPackForExchange<__nv_bfloat16>(const __nv_bfloat16*, const float*,
                                                               const DcpExchangeLayout&, void*,
                                                               cudaStream_t);
extern template absl::Status DcpPackForExchange<__half>(const __half*, const float*,
                                                        const DcpExchangeLayout&, void*,
                                                        cudaStream_t);
extern template absl::Status DcpMergeReceived<float>(const void*, const DcpExchangeLayout&, float*,
                                                     float*, cudaStream_t);
extern template absl::Status DcpMergeReceived<__nv_bfloat16>(const void*, const DcpExchangeLayout&,
                                                             __nv_bfloat16*, float*, cudaStream_t);
extern template absl::Status DcpMergeReceived<__half>(const void*, const DcpExchangeLayout&,
                                                      __half*, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_DCP_EXCHANGE_CUDA_H_
