// CommandLine: how rank 0's commands (tandem.v1.RankCommand: steps, executor creation, KV work,
// keepalive, shutdown) reach the other ranks of a worker group. GroupChannel sends through one,
// RunFollower receives through one; which transport carries the bytes is this seam's business:
//   * GlooCommandLine (here): two broadcasts on the group (length, bytes; plan_codec.h). Any
//     group, one host or many.
//   * ShmCommandLine (shm_command_line.h): a shared-memory slot, for ranks rank 0 started on its
//     own host (`--tp=N` alone); commands larger than the slot fall back to the group's broadcast.
// Both sides of a group must use the same kind of line: the group's collectives are matched by
// order, and a line that broadcasts on the group takes part in that order.
//
// Failure model: the first failure breaks the line for good (like a ProcessGroup); status()
// reports it. Errors are the group's (UNAVAILABLE / DEADLINE_EXCEEDED at its deadline).
//
// Thread safety: Send (rank 0) and Receive (followers) are called by one thread at a time;
// status() is thread-safe.
#ifndef TANDEM_RUNTIME_PARALLEL_COMMAND_LINE_H_
#define TANDEM_RUNTIME_PARALLEL_COMMAND_LINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "tandem/v1/rank_plan.pb.h"

namespace tandem::runtime {

class CommandLine {
 public:
  virtual ~CommandLine() = default;
  // Rank 0: delivers `command` to every other rank (returns once it may send the next one).
  virtual absl::Status Send(const tandem::v1::RankCommand& command) = 0;
  // Ranks > 0: the next command of rank 0.
  virtual absl::StatusOr<tandem::v1::RankCommand> Receive() = 0;
  // OK while the line works; its first failure afterwards.
  virtual absl::Status status() const = 0;
};

// The general line: SendCommand / ReceiveCommand on `group` (which must outlive it).
std::unique_ptr<CommandLine> GlooCommandLine(comm::ProcessGroup* group);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_COMMAND_LINE_H_
