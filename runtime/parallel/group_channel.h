// GroupChannel: rank 0's one line to the other ranks of its worker group (ARCHITECTURE.md
// "Worker groups"). Every command rank 0 sends (a step's plan, executor creation, KV transfer
// work, keepalives, shutdown) goes through it, one at a time: the group's collectives are
// matched by order, so the step loop, the keepalive and the KV transfer calls of RPC threads
// must never interleave. Followers answer in RunFollower (group_executor.h).
//
// Keepalive: when no command went out for `keepalive`, the channel sends one, so an idle
// follower's wait never reaches the group's deadline and a dead follower is noticed.
//
// The commands travel on a CommandLine (command_line.h): the group's broadcast, or shared memory
// for ranks started on this host (shm_command_line.h); replies and a step's own collectives run
// on the group.
//
// Failure model: the process group's (comm/process_group.h) and the line's: the first failure
// breaks the group for good; every later call fails at once with it.
//
// Thread safety: thread-safe; calls are serialized.
#ifndef TANDEM_RUNTIME_PARALLEL_GROUP_CHANNEL_H_
#define TANDEM_RUNTIME_PARALLEL_GROUP_CHANNEL_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "runtime/parallel/command_line.h"
#include "tandem/v1/rank_plan.pb.h"

namespace tandem::runtime {

class GroupChannel {
 public:
  // `group` (rank 0's) must outlive the channel. `line`: how commands reach the followers (they
  // must receive on the same kind); null: the group's broadcast (GlooCommandLine).
  GroupChannel(comm::ProcessGroup* group, absl::Duration keepalive,
               std::unique_ptr<CommandLine> line = nullptr);
  // Shutdown(), then joins the keepalive thread.
  ~GroupChannel();
  GroupChannel(const GroupChannel&) = delete;
  GroupChannel& operator=(const GroupChannel&) = delete;

  // Broadcasts `command`, then runs `local` (this rank's share of the work, which may take part
  // in collectives of its own: a step's all-reduces) before the next command may go out.
  absl::Status Run(const tandem::v1::RankCommand& command,
                   const std::function<absl::Status()>& local);
  // Broadcasts `command`, runs `local` for this rank's reply, and gathers every rank's reply
  // (rank order; rank 0's is `local`'s).
  absl::StatusOr<std::vector<std::string>> Call(const tandem::v1::RankCommand& command,
                                                const std::function<std::string()>& local);
  // Sends `command`, then runs `fn` on the group (collectives of the command's own shape, e.g.
  // every rank's answer to executor creation) before the next command may go out.
  absl::Status RunWithGroup(const tandem::v1::RankCommand& command,
                            const std::function<absl::Status(comm::ProcessGroup*)>& fn);
  // Runs `fn` on the group with the channel held (startup exchanges of their own shape).
  absl::Status WithGroup(const std::function<absl::Status(comm::ProcessGroup*)>& fn);
  // Tells the followers to exit (once, while the group works); later calls fail UNAVAILABLE.
  void Shutdown();

  absl::Status status() const { return line_->status(); }
  int size() const { return group_->size(); }

 private:
  void KeepaliveLoop();
  absl::Status CheckOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  comm::ProcessGroup* const group_;
  const std::unique_ptr<CommandLine> line_;
  const absl::Duration keepalive_;
  mutable absl::Mutex mu_;
  absl::Time last_command_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keepalive_thread_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_GROUP_CHANNEL_H_
