// Wide expert parallelism's dispatch and combine on the CUDA backend (`--tp=N
// --enable_expert_parallel --dp_attention`; runtime/model/tensor_parallel.h): the device twin of
// runtime/cpu/moe_all_to_all.h, the "prepare / finalize" halves around CudaMoeMlp's unchanged
// expert kernels (as vLLM's FusedMoEPrepareAndFinalize pairs with its experts). Per MoE layer,
// every rank, with T >= 0 tokens of its own (an idle rank: T = 0, same collectives):
//
//   Dispatch  plan (kernels/moe/moe_dispatch_cuda.h: each token once per destination rank, token
//             order) and pack on the device; ONE all-gather of the [N] row counts (the [N, N]
//             matrix: what every rank receives) and its read-back, the layer's one host sync;
//             ONE all-to-all of uneven splits moves the rows (NCCL: grouped ncclSend / ncclRecv,
//             DeviceCommunicator::AllToAll); unpack into x [R, H] and a routing of this rank's
//             experts (other ranks' choices on the zero expert with weight 0);
//   (the caller runs its experts on the R rows into expert_out(): one row per received row)
//   Combine   ONE all-to-all back (the inverse splits), then out[t] = the sum of token t's
//             returned rows in rank order + its (gated) shared expert.
//
// Rows travel as 4-byte words (CommDtype::kF32: the packed 16-bit activations and the int32 /
// fp32 metadata are moved bit for bit by NCCL and by the host-staged communicator alike). That
// form (capacity 0) is not capturable in a CUDA graph (the counts read-back). With a capacity C
// (every rank of the step passing the same C >= its tokens: the runner's padded decode size)
// the fixed layout of kernels/moe/moe_dispatch_cuda.h runs instead: no all-gather, no host sync,
// each pair of ranks exchanges exactly C rows (padding rows go to the receiver's zero expert),
// R = N * C rows received, every size a host constant, so the layer is captured with the step.
//
// Thread safety: one caller (the model's stream) at a time; buffers are reused across layers.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MOE_ALL_TO_ALL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MOE_ALL_TO_ALL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime::cuda {

class CudaMoeAllToAll {
 public:
  // `config`: the rank's (dp_attention, its expert_placement over comm->size() ranks, expert_rank
  // = comm->rank()); `max_tokens`: this rank's tokens per step; `comm` outlives this.
  // INVALID_ARGUMENT naming the numbers otherwise (or more than kMoeDispatchMaxRanks ranks).
  static absl::StatusOr<std::unique_ptr<CudaMoeAllToAll>> Create(const ModelConfig& config,
                                                                 int64_t max_tokens,
                                                                 comm::DeviceCommunicator* comm);

  // Rows this rank can receive in one layer: every rank's max_tokens (each token once per rank).
  int64_t max_received() const { return max_received_; }

  // x [T, H], expert_ids / weights [T, k] (global ids; device, the activation dtype T_ of 2
  // bytes). Collective. Returns R, the rows received: received_x() [R, H]; recv_ids /
  // recv_weights [R, k] (caller's device buffers, may be expert_ids / weights themselves: they
  // are read before being written) the rows' routing over this rank's experts, the zero expert
  // being slot NumHeldExperts(). Each pair's global expert is added to `load` ([E] int64, device)
  // or null. capacity > 0: the fixed layout (T <= capacity <= max_tokens; R = N * capacity,
  // padding included; the same capacity on every rank of the step). Errors: the communicator's
  // (the group is then broken), INVALID_ARGUMENT for T outside [0, max_tokens], a capacity
  // outside [T, max_tokens] or more than max_received() rows.
  template <typename T>
  absl::StatusOr<int64_t> Dispatch(const T* x, int64_t num_tokens, const int32_t* expert_ids,
                                   const float* weights, int64_t* load, int32_t* recv_ids,
                                   float* recv_weights, cudaStream_t stream, int64_t capacity = 0);
  template <typename T>
  T* received_x() const {
    return received_x_.get<T>();
  }
  // [max_received, H]: where the caller writes each received row's expert sum before Combine.
  template <typename T>
  T* expert_out() const {
    return expert_out_.get<T>();
  }

  // After Dispatch (same num_tokens): out[T, H] = the returned rows summed + g * shared (shared
  // [T, H] or null; shared_gate [H] or null: g = sigmoid(x . shared_gate), else 1). out may
  // alias x. Collective.
  template <typename T>
  absl::Status Combine(int64_t num_tokens, const T* shared, const T* shared_gate, const T* x,
                       T* out, cudaStream_t stream);

  // Rows this rank sent to / received from each rank in the last Dispatch ([N]; tests, metrics;
  // in the fixed layout the capacity each, padding included).
  const std::vector<int64_t>& last_sent_rows() const { return send_rows_; }
  const std::vector<int64_t>& last_received_rows() const { return recv_rows_; }
  // Collectives issued since creation (an all-gather and two all-to-alls per layer; two
  // all-to-alls in the fixed layout).
  int64_t collectives() const { return collectives_; }

 private:
  CudaMoeAllToAll(const ModelConfig& config, int64_t max_tokens, comm::DeviceCommunicator* comm);

  comm::DeviceCommunicator* const comm_;
  const int n_;
  const int64_t hidden_, top_k_, width_, max_tokens_, max_received_;
  const int32_t zero_slot_;
  DeviceBuffer rank_of_, slot_in_owner_;    // [E] int32
  DeviceBuffer pos_, counts_, all_counts_;  // [max_tokens, N], [N], [N, N] int32
  PinnedBuffer all_counts_host_;            // [N, N] int32
  DeviceBuffer send_, recv_;                // [rows, width_] 16-bit
  DeviceBuffer received_x_, expert_out_;    // [max_received, H]
  DeviceBuffer back_;                       // [max_tokens * N, H]
  std::vector<int64_t> send_rows_, recv_rows_, send_words_, recv_words_;
  int64_t capacity_ = 0;  // the last Dispatch's (0: the uneven splits)
  int64_t collectives_ = 0;
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MOE_ALL_TO_ALL_H_
