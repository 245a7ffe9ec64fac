// A ProcessGroup decorator that counts every collective and the elements it moves, then forwards
// to the wrapped group. Tests and benchmarks use it to pin a model's communication pattern (e.g.
// decode context parallelism: one all-to-all per layer, whose size does not grow with context).
//
// Thread safety: the counters are atomics, so a test may read them while the group runs; the
// wrapped group's own rules apply to the calls (one thread at a time).
#ifndef TANDEM_COMM_COUNTING_PROCESS_GROUP_H_
#define TANDEM_COMM_COUNTING_PROCESS_GROUP_H_

#include <atomic>
#include <cstdint>

#include "comm/process_group.h"

namespace tandem::comm {

// What a CountingProcessGroup saw (a plain copy of the counters).
struct CollectiveCounts {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0, broadcast = 0,
          barrier = 0, send = 0, recv = 0;
  // Elements this rank put in: floats (broadcast: bytes); all-to-all counts what it sent.
  int64_t all_reduce_elems = 0, all_gather_elems = 0, all_to_all_elems = 0;
};

// What a group did between two snapshots of its counts: `after` minus `before`, field by field.
inline CollectiveCounts CountsBetween(const CollectiveCounts& before,
                                      const CollectiveCounts& after) {
  CollectiveCounts d;
  d.all_reduce = after.all_reduce - before.all_reduce;
  d.all_gather = after.all_gather - before.all_gather;
  d.reduce_scatter = after.reduce_scatter - before.reduce_scatter;
  d.all_to_all = after.all_to_all - before.all_to_all;
  d.broadcast = after.broadcast - before.broadcast;
  d.barrier = after.barrier - before.barrier;
  d.send = after.send - before.send;
  d.recv = after.recv - before.recv;
  d.all_reduce_elems = after.all_reduce_elems - before.all_reduce_elems;
  d.all_gather_elems = after.all_gather_elems - before.all_gather_elems;
  d.all_to_all_elems = after.all_to_all_elems - before.all_to_all_elems;
  return d;
}

class CountingProcessGroup final : public ProcessGroup {
 public:
  // `inner` must outlive this wrapper.
  explicit CountingProcessGroup(ProcessGroup* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status status() const override { return inner_->status(); }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    Add(all_reduce_, 1);
    Add(all_reduce_elems_, static_cast<int64_t>(data.size()));
    return inner_->AllReduceSum(data);
  }
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override {
    Add(all_gather_, 1);
    Add(all_gather_elems_, static_cast<int64_t>(in.size()));
    return inner_->AllGather(in, out);
  }
  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override {
    Add(reduce_scatter_, 1);
    return inner_->ReduceScatterSum(in, out);
  }
  absl::Status Broadcast(absl::Span<char> data, int root) override {
    Add(broadcast_, 1);
    return inner_->Broadcast(data, root);
  }
  absl::Status AllToAll(absl::Span<const float> in, absl::Span<const int64_t> send_counts,
                        absl::Span<float> out, absl::Span<const int64_t> recv_counts) override {
    Add(all_to_all_, 1);
    Add(all_to_all_elems_, static_cast<int64_t>(in.size()));
    return inner_->AllToAll(in, send_counts, out, recv_counts);
  }
  absl::Status Barrier() override {
    Add(barrier_, 1);
    return inner_->Barrier();
  }
  absl::Status Send(absl::Span<const float> data, int peer) override {
    Add(send_, 1);
    return inner_->Send(data, peer);
  }
  absl::Status Recv(absl::Span<float> data, int peer) override {
    Add(recv_, 1);
    return inner_->Recv(data, peer);
  }

  CollectiveCounts counts() const {
    CollectiveCounts c;
    c.all_reduce = all_reduce_.load();
    c.all_gather = all_gather_.load();
    c.reduce_scatter = reduce_scatter_.load();
    c.all_to_all = all_to_all_.load();
    c.broadcast = broadcast_.load();
    c.barrier = barrier_.load();
    c.send = send_.load();
    c.recv = recv_.load();
    c.all_reduce_elems = all_reduce_elems_.load();
    c.all_gather_elems = all_gather_elems_.load();
    c.all_to_all_elems = all_to_all_elems_.load();
    return c;
  }

 private:
  static void Add(std::atomic<int64_t>& counter, int64_t n) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }

  ProcessGroup* const inner_;
  std::atomic<int64_t> all_reduce_{0}, all_gather_{0}, reduce_scatter_{0}, all_to_all_{0},
      broadcast_{0}, barrier_{0}, send_{0}, recv_{0}, all_reduce_elems_{0}, all_gather_elems_{0},
      all_to_all_elems_{0};
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_COUNTING_PROCESS_GROUP_H_
