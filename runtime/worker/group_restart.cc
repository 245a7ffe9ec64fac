#include "runtime/worker/group_restart.h"

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::runtime {
namespace {

// Every descriptor above stderr. close_range (Linux 5.9); else one by one from /proc/self/fd.
void CloseDescriptorsAboveStderr() {
#if defined(SYS_close_range)
  if (syscall(SYS_close_range, 3u, ~0u, 0u) == 0) return;
#endif
  std::vector<int> fds;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      int fd = -1;
      if (absl::SimpleAtoi(entry->d_name, &fd) && fd > 2 && fd != dirfd(dir)) fds.push_back(fd);
    }
    closedir(dir);
  }
  for (int fd : fds) close(fd);
}

}  // namespace

ServeEnd WaitForSignalOrBrokenGroup(TerminationSignals& signals,
                                    const std::function<absl::Status()>& group_health,
                                    absl::Duration poll) {
  if (group_health == nullptr) return ServeEnd{signals.Wait(), absl::OkStatus()};
  while (true) {
    if (const int sig = signals.WaitFor(poll); sig != 0) return ServeEnd{sig, absl::OkStatus()};
    if (absl::Status health = group_health(); !health.ok()) return ServeEnd{0, health};
  }
}

absl::Duration GroupRestartDelay(int quick_restarts) {
  if (quick_restarts <= 1) return absl::ZeroDuration();
  const int doublings = std::min(quick_restarts - 2, 5);
  return std::min(absl::Seconds(1) * (1 << doublings), absl::Seconds(30));
}

absl::Status ExecSelf(const std::vector<std::string>& argv,
                      const std::vector<std::string>& overrides) {
  std::vector<std::string> args = argv;
  args.insert(args.end(), overrides.begin(), overrides.end());
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  CloseDescriptorsAboveStderr();
  execv("/proc/self/exe", cargv.data());
  return absl::InternalError(absl::StrCat("exec /proc/self/exe: ", std::strerror(errno)));
}

}  // namespace tandem::runtime
