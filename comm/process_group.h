// ProcessGroup: the collectives a worker group's ranks run together (ARCHITECTURE.md, "Worker
// groups"): all-reduce (TP row-parallel layers), all-gather (vocab-parallel logits), broadcast
// (rank 0's per-step plan), reduce-scatter, all-to-all with uneven splits (DCP), barrier,
// send/recv. On host memory: the backend is Gloo (gloo_process_group.h; the CPU backend, and the
// control plane of CUDA groups). Device tensors of CUDA ranks go through a DeviceCommunicator
// (device_communicator.h: NCCL, or host-staged over this interface).
//
// Failure model: every collective has the group's deadline. A rank that died (its connections
// closed) makes its peers' collectives fail UNAVAILABLE; a rank that is wedged (alive but not
// calling) makes them fail DEADLINE_EXCEEDED when the deadline passes. Either way the group is
// broken afterwards (collectives are matched by order): every later call fails at once with the
// first error, and the worker reports itself unhealthy.
//
// Thread safety: one thread calls a group's collectives (they are ordered); rank()/size() and
// status() are thread-safe.
#ifndef TANDEM_COMM_PROCESS_GROUP_H_
#define TANDEM_COMM_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem::comm {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // OK while the group works; its first failure afterwards.
  virtual absl::Status status() const = 0;

  // data[i] = sum over ranks of data[i]; same size on every rank.
  virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;
  // out = the ranks' `in`, concatenated in rank order; out.size() = size() * in.size(); an
  // empty `in` (on every rank: the sizes are the same) is a no-op.
  virtual absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) = 0;
  // out[i] = sum over ranks of in[rank() * out.size() + i]; in.size() = size() * out.size().
  virtual absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) = 0;
  // data = root's data on every rank (bytes: plans and other small messages).
  virtual absl::Status Broadcast(absl::Span<char> data, int root) = 0;
  // Rank r sends in[send_offsets[j] .. + send_counts[j]) to rank j, receiving rank j's part for
  // it into the next recv_counts[j] elements of out (rank order). Counts may differ per pair
  // (and be 0); send_counts of j must equal rank j's recv_counts of r.
  virtual absl::Status AllToAll(absl::Span<const float> in, absl::Span<const int64_t> send_counts,
                                absl::Span<float> out, absl::Span<const int64_t> recv_counts) = 0;
  virtual absl::Status Barrier() = 0;
  // Point to point: the n-th Send from rank a to rank b meets b's n-th Recv from a (same size).
  // Only the two ranks take part; the group's other collectives are unaffected.
  virtual absl::Status Send(absl::Span<const float> data, int peer) = 0;
  virtual absl::Status Recv(absl::Span<float> data, int peer) = 0;

  // A startup meeting point that reports who it waits for: this rank arrives at `phase` (each
  // rank once per phase name), then waits up to `limit` for every rank, calling
  // progress(missing ranks, time waited) every `every` while some are missing.
  // DEADLINE_EXCEEDED naming the missing ranks at `limit`. Groups without a store to poll meet
  // at a Barrier() (no progress; the group's own deadline).
  using ArrivalProgress = std::function<void(const std::vector<int>& missing, absl::Duration)>;
  virtual absl::Status MeetWithProgress(const std::string& phase, absl::Duration limit,
                                        absl::Duration every, const ArrivalProgress& progress) {
    (void)phase, (void)limit, (void)every, (void)progress;
    return Barrier();
  }
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_PROCESS_GROUP_H_
