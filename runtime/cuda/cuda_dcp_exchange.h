// Decode context parallelism's per-layer exchange on the CUDA backend: the device twin of
// LlamaModel::ExchangeAttention (runtime/cpu/llama_model.cc). After shard attention a rank
// holds partials (out, lse) of ALL its attention slice's query heads over ITS keys; this packs
// them (kernels/attention/cuda/dcp_exchange_cuda.h, the wire layout of
// kernels/attention/dcp_exchange.h), runs ONE all-to-all of the whole communicator group (zero
// counts outside the rank's slice: the slice's ranks are contiguous, t*KVP .. t*KVP+KVP-1) and
// merges the KVP partials of the rank's num_heads / KVP heads by LSE into merged(): o_proj's input.
//
// The all-to-all moves the packed buffer as fp32 words (RegionBytes() is a multiple of 16), so
// bf16/fp16 out and fp32 lse travel bit for bit over NCCL and host-staged Gloo alike (a 16-bit
// dtype would make the host-staged path round the lse's bytes through a float conversion).
//
// The pack and merge kernels move 16-byte vectors, so a head of head_dim x elem_bytes bytes not a
// multiple of 16 (the tiny MLA test models' v_head_dim 12) travels padded: the heads are copied
// into rows of wire_dim() (head_dim rounded up to 16 bytes; the padding zero, never read back)
// before the pack, and the merged rows copied back to head_dim after the merge (two strided
// device copies per layer; none for the real models' 64 / 128 / 256).
//
// Buffers are allocated once for max_tokens; Exchange() only enqueues work on `stream` (no
// allocation, no host sync of its own), so it is capturable in a CUDA graph when the
// communicator is (NCCL). Thread safety: not thread-safe; the model's one thread drives it.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_DCP_EXCHANGE_H_
#define TANDEM_RUNTIME_CUDA_CUDA_DCP_EXCHANGE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "kernels/attention/dcp_shard.h"
#include "runtime/cuda/device_buffer.h"

namespace tandem::runtime::cuda {

class CudaDcpExchange {
 public:
  // `comm` (outliving the exchange) is the whole tensor-parallel group; REQUIRES dcp.size > 1.
  // INVALID_ARGUMENT unless dcp is valid, dcp.size divides comm->size() and num_heads (the
  // slice's query heads), and dcp.rank == comm->rank() % dcp.size. elem_bytes: 2 (bf16/fp16).
  static absl::StatusOr<std::unique_ptr<CudaDcpExchange>> Create(
      const kernels::DcpShard& dcp, comm::DeviceCommunicator* comm, int64_t max_tokens,
      int64_t num_heads, int64_t head_dim, int64_t elem_bytes);

  // Where shard attention writes its LSE: [max_tokens, num_heads] fp32, device.
  float* lse() const { return lse_.get<float>(); }
  // o_proj's input after Exchange(): [num_tokens, heads_per_rank(), head_dim] of T, device.
  template <typename T>
  T* merged() const {
    return merged_.get<T>();
  }
  int64_t heads_per_rank() const { return num_heads_ / dcp_.size; }
  // Elements per head on the wire: head_dim rounded up to a multiple of 16 bytes.
  int64_t wire_dim() const { return wire_dim_; }

  // attn: [num_tokens, num_heads, head_dim] of T (this shard's partial; its LSE in lse()) ->
  // merged(). Collective: every rank of the group calls it with the same num_tokens (<=
  // max_tokens). T is __nv_bfloat16 or __half.
  template <typename T>
  absl::Status Exchange(const T* attn, int64_t num_tokens, cudaStream_t stream);

 private:
  CudaDcpExchange(const kernels::DcpShard& dcp, comm::DeviceCommunicator* comm, int64_t num_heads,
                  int64_t head_dim, int64_t elem_bytes);

  const kernels::DcpShard dcp_;
  comm::DeviceCommunicator* const comm_;
  const int64_t num_heads_, head_dim_, elem_bytes_, wire_dim_;
  DeviceBuffer lse_, send_, recv_, merged_;
  // wire_dim_ > head_dim_ only: the heads padded to wire_dim_ before the pack ([max_tokens,
  // num_heads, wire_dim]) and the merged heads before the copy back ([max_tokens, hpr, wire_dim]).
  DeviceBuffer padded_in_, padded_out_;
  std::vector<int64_t> counts_;  // [comm size] fp32 words per peer, reused across calls
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_DCP_EXCHANGE_H_
