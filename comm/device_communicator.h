// DeviceCommunicator: the collectives of a worker group's CUDA ranks on device memory, ordered on
// a CUDA stream (ARCHITECTURE.md, "Worker groups"). Two backends:
//   * NcclCommunicator (nccl_communicator.h): NCCL, one GPU per rank; capturable in CUDA graphs.
//   * HostStagedCommunicator (host_staged_communicator.h): copies through host memory and runs
//     the collective on a host ProcessGroup (Gloo): the correctness path for ranks that share one
//     GPU (NCCL refuses two ranks on one device). Not capturable.
// The host ProcessGroup (process_group.h) stays the group's control plane (rank 0's plans,
// startup agreement, keepalives); this interface carries the tensors.
//
// Semantics: every call enqueues on `stream` and returns; the results are valid once the stream
// reaches that point. Synchronize(stream) waits for it within the group's deadline: a peer that
// died or is wedged makes it fail (UNAVAILABLE / DEADLINE_EXCEEDED) instead of hanging, the
// communicator is aborted, and every later call fails at once with that first error (status()).
// Collectives are matched by order on every rank, like ProcessGroup's.
//
// Thread safety: one thread issues a communicator's calls; rank()/size()/status() are
// thread-safe.
#ifndef TANDEM_COMM_DEVICE_COMMUNICATOR_H_
#define TANDEM_COMM_DEVICE_COMMUNICATOR_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

struct CUstream_st;  // cudaStream_t, without making this header depend on the CUDA toolkit

namespace tandem::comm {

using DeviceStream = CUstream_st*;

enum class CommDtype { kF32, kBf16, kF16 };

inline int64_t CommDtypeBytes(CommDtype dtype) { return dtype == CommDtype::kF32 ? 4 : 2; }

// The all-reduce of a row-parallel layer's output fused with the residual add and RMSNorm that
// follow it (AllReduceAddRmsNorm below), per row of `hidden` 16-bit values:
//   sum = all-reduce(in)
//   add_residual: residual = round(residual + sum); otherwise residual = sum
//   out = round(residual * rsqrt(mean(residual^2) + eps) * weight)
// in, residual, out: [rows, hidden] device; weight: [hidden]. `in` may alias residual or out;
// residual and out must not overlap.
struct AddRmsNormArgs {
  const void* in = nullptr;
  void* residual = nullptr;
  const void* weight = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 0.0f;
  bool add_residual = true;
};

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual absl::Status status() const = 0;
  // "nccl" or "gloo-host-staged".
  virtual std::string_view backend() const = 0;
  // True when the calls may be made while `stream` is being captured into a CUDA graph.
  virtual bool graph_capturable() const = 0;

  // data[i] = sum over ranks (accumulated in the dtype by NCCL; in fp32 when host-staged).
  virtual absl::Status AllReduceSum(void* data, int64_t count, CommDtype dtype,
                                    DeviceStream stream) = 0;
  // out [size() x count] = every rank's `in` [count], in rank order.
  virtual absl::Status AllGather(const void* in, void* out, int64_t count, CommDtype dtype,
                                 DeviceStream stream) = 0;
  // out [count] = sum over ranks of in[rank() * count .. + count); in: [size() x count].
  virtual absl::Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDtype dtype,
                                        DeviceStream stream) = 0;
  // As ProcessGroup::AllToAll on device buffers: in holds the parts for ranks 0..n-1 back to back
  // (send_counts elements each), out receives rank j's part for this rank at the j-th place
  // (recv_counts elements each); counts may differ per pair and be 0.
  virtual absl::Status AllToAll(const void* in, absl::Span<const int64_t> send_counts, void* out,
                                absl::Span<const int64_t> recv_counts, CommDtype dtype,
                                DeviceStream stream) = 0;
  // Point to point; a Send to `peer` must meet a Recv of the same count from this rank.
  virtual absl::Status Send(const void* data, int64_t count, CommDtype dtype, int peer,
                            DeviceStream stream) = 0;
  virtual absl::Status Recv(void* data, int64_t count, CommDtype dtype, int peer,
                            DeviceStream stream) = 0;
  // AddRmsNormArgs as one fused collective where this communicator has one for the shape (every
  // rank decides alike): true, enqueued. False: nothing enqueued; the caller runs AllReduceSum
  // and its own add + norm (the default).
  virtual absl::StatusOr<bool> AllReduceAddRmsNorm(const AddRmsNormArgs& args, CommDtype dtype,
                                                   DeviceStream stream) {
    (void)args, (void)dtype, (void)stream;
    return false;
  }
  // Waits for everything enqueued on `stream` so far, within the group's deadline.
  virtual absl::Status Synchronize(DeviceStream stream) = 0;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_DEVICE_COMMUNICATOR_H_
