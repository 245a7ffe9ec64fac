// ShmCommandLine: the fast CommandLine (command_line.h) for ranks rank 0 started on its own host:
// rank 0 writes each command into one shared-memory slot (plan_segment.h) and followers copy it
// out; nothing goes over the group's sockets. A command larger than the slot is announced in the
// slot ("via group") and its bytes follow as the group's broadcast (plan_codec.h), so both sides
// still run the same collectives in the same order.
//
// Waiting: a follower spins briefly on the slot's sequence, then sleeps on a futex (woken by
// rank 0's publish), waking every few milliseconds to check its deadline and that rank 0 is
// alive. Rank 0 writes the slot only after every follower acknowledged the previous command.
// Deadlines are the group's: a follower that hears nothing (not even a keepalive) for `timeout`
// fails DEADLINE_EXCEEDED; so does rank 0 when a follower has not taken the previous command
// within `timeout`. Rank 0 gone (its pid no longer exists) fails a follower UNAVAILABLE. Either
// way the line is broken for good.
//
// Thread safety: as CommandLine. The segment and the group must outlive the line.
#ifndef TANDEM_RUNTIME_PARALLEL_SHM_COMMAND_LINE_H_
#define TANDEM_RUNTIME_PARALLEL_SHM_COMMAND_LINE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/parallel/command_line.h"
#include "runtime/parallel/plan_segment.h"

namespace tandem::runtime {

class ShmCommandLine final : public CommandLine {
 public:
  // `group`: this rank's group (its rank and size; the fallback of large commands). A follower
  // registers in the segment here.
  ShmCommandLine(PlanSegment* segment, comm::ProcessGroup* group, absl::Duration timeout);

  absl::Status Send(const tandem::v1::RankCommand& command) override;
  absl::StatusOr<tandem::v1::RankCommand> Receive() override;
  absl::Status status() const override;

 private:
  // Rank 0: every follower has taken command `seq` out of the slot.
  absl::Status WaitForAcks(uint64_t seq);
  // A follower: command `seq` is in the slot.
  absl::Status WaitForSeq(uint64_t seq);
  absl::Status Fail(absl::Status s);

  PlanSegmentLayout* const slot_;
  comm::ProcessGroup* const group_;
  const absl::Duration timeout_;
  uint64_t last_seq_ = 0;  // the last command sent / received
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_SHM_COMMAND_LINE_H_
