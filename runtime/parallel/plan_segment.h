// PlanSegment: the shared memory through which rank 0 hands its commands to the ranks it started
// on its own host (ShmCommandLine, shm_command_line.h). Rank 0 creates it before starting them;
// they inherit its file descriptor (the spawned command line names it: --dist_shm_fd) and map it.
// The name in /dev/shm is unlinked the moment it is created, so nothing is left there whatever
// happens to the processes: the memory goes when the last mapping and descriptor do.
//
// Layout (wire format between the processes of one binary; little-endian, x86-64 / aarch64):
//   header   magic, number of ranks, rank 0's pid
//   slot     seq (the last published command, 0: none), wake (futex word bumped after each
//            publish), waiters (followers asleep on wake), via_group (1: this command's bytes
//            follow on the group's broadcast), length, bytes[kPlanSlotBytes]
//   acks     per follower: the last seq it has taken out of the slot, its pid
// One writer (rank 0) publishes seq with release after writing length and bytes; a follower
// reads seq with acquire, copies the bytes, then stores its ack with release. Rank 0 writes the
// slot again only when every follower's ack equals seq.
//
// Thread safety: the mapping is shared by processes; the protocol above is ShmCommandLine's.
#ifndef TANDEM_RUNTIME_PARALLEL_PLAN_SEGMENT_H_
#define TANDEM_RUNTIME_PARALLEL_PLAN_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace tandem::runtime {

// A decode step of 64 sequences is ~2 KiB; prefill plans of thousands of tokens fit too. A
// larger command goes over the group (ShmCommandLine's fallback).
inline constexpr size_t kPlanSlotBytes = size_t{256} << 10;
inline constexpr int kPlanSegmentMaxRanks = 64;

struct alignas(64) PlanFollowerAck {
  std::atomic<uint64_t> seq;
  std::atomic<int32_t> pid;
};

struct PlanSegmentLayout {
  uint64_t magic;
  int32_t num_ranks;
  int32_t leader_pid;
  alignas(64) std::atomic<uint64_t> seq;
  std::atomic<uint32_t> wake;
  std::atomic<uint32_t> waiters;
  uint32_t via_group;
  uint64_t length;
  PlanFollowerAck acks[kPlanSegmentMaxRanks];
  alignas(64) char bytes[kPlanSlotBytes];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

class PlanSegment {
 public:
  // Rank 0: a zeroed segment for `num_ranks` (2..kPlanSegmentMaxRanks), already unlinked.
  // Its fd() is close-on-exec: the spawner clears that in the child only.
  static absl::StatusOr<std::unique_ptr<PlanSegment>> Create(int num_ranks);
  // A rank rank 0 started: maps the segment behind the inherited `fd` and closes `fd`.
  // INVALID_ARGUMENT when it is not a plan segment.
  static absl::StatusOr<std::unique_ptr<PlanSegment>> Attach(int fd);
  ~PlanSegment();
  PlanSegment(const PlanSegment&) = delete;
  PlanSegment& operator=(const PlanSegment&) = delete;

  // Rank 0's descriptor of the segment (-1 on an attached one).
  int fd() const { return fd_; }
  PlanSegmentLayout* layout() const { return layout_; }

 private:
  PlanSegment(int fd, PlanSegmentLayout* layout) : fd_(fd), layout_(layout) {}
  const int fd_;
  PlanSegmentLayout* const layout_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_PLAN_SEGMENT_H_
