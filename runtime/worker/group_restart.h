// How rank 0 of a worker group (tandem_worker --tp=N) brings its group back after a rank died or
// wedged (issue 30, item 9). A broken group cannot run a step again (runtime/parallel/README.md,
// "Failure model"), and the collectives cannot be re-formed under a live engine, so the whole
// group starts over:
//
//   1. rank 0 waits for SIGTERM / SIGINT or for the group to break (WaitForSignalOrBrokenGroup):
//      a rank process it started exited (RankGroup::CheckRanksAlive, seen within `poll`), or a
//      command or collective failed (GroupChannel::status: UNAVAILABLE at once for a dead peer,
//      DEADLINE_EXCEEDED after --dist_timeout_s for a wedged one);
//   2. it tells the router at once (Drain with no wait: DRAINING), stops serving and tears the
//      group down (the other rank processes are killed and reaped); requests in flight had
//      already failed UNAVAILABLE, leases it held die with the process and readers recompute;
//   3. after GroupRestartDelay it re-runs its own binary in place (ExecSelf: the same pid, so
//      up.sh's pid file, down.sh and any supervisor keep working) on the address it was bound
//      to; the new process starts the ranks again, registers under the same worker id with a new
//      epoch, and the router routes to it again.
//
// A group started by a launcher (--rank) instead exits 1 and lets the launcher restart every
// rank (a LeaderWorkerSet recreates the group; Slurm ends the step).
//
// Thread safety: call from main's thread (the one that made TerminationSignals).
#ifndef TANDEM_RUNTIME_WORKER_GROUP_RESTART_H_
#define TANDEM_RUNTIME_WORKER_GROUP_RESTART_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/daemon.h"

namespace tandem::runtime {

// What ended serving: a termination signal, or the group broke.
struct ServeEnd {
  int signal = 0;       // SIGTERM / SIGINT; 0 when the group broke
  absl::Status broken;  // the group's error (OK when a signal ended it)
};

// Waits for a termination signal or, checking `group_health` every `poll`, for it to fail.
// A null `group_health` (a worker of one rank, or restarts disabled): only a signal ends it.
ServeEnd WaitForSignalOrBrokenGroup(TerminationSignals& signals,
                                    const std::function<absl::Status()>& group_health,
                                    absl::Duration poll = absl::Milliseconds(100));

// A group broken again and again (a rank that crashes at once) must not spin: the wait before
// quick restart number `quick_restarts` (1 = the first one in a row): none for the first, then
// 1 s, 2 s, 4 s ... at most 30 s. A group that served for kStableServing first counts as new.
absl::Duration GroupRestartDelay(int quick_restarts);
inline constexpr absl::Duration kStableServing = absl::Seconds(60);

// Re-runs this process's binary (/proc/self/exe) in place with `argv` followed by `overrides`
// (absl flags: the last value wins). Flushes stdout / stderr and closes every descriptor above
// stderr first (none leaks into the new image: a listening socket kept open would hold its
// port). Returns only when exec failed (INTERNAL naming errno).
absl::Status ExecSelf(const std::vector<std::string>& argv,
                      const std::vector<std::string>& overrides);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_GROUP_RESTART_H_
