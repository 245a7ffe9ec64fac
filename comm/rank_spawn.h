// Multi-process GPU tests and benchmarks of comm/: the binary re-runs itself as the ranks
// (TANDEM_RANK_* in the environment), so no CUDA state crosses a fork. Test-only helpers.
#ifndef TANDEM_COMM_RANK_SPAWN_H_
#define TANDEM_COMM_RANK_SPAWN_H_

#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace tandem::comm {

// This process's rank when it is one of the spawned ranks (TANDEM_RANK_ID set), else -1.
inline int SpawnedRank() {
  const char* r = std::getenv("TANDEM_RANK_ID");
  return r == nullptr ? -1 : std::atoi(r);
}
inline int SpawnedWorld() { return std::atoi(std::getenv("TANDEM_RANK_WORLD")); }
inline int SpawnedPort() { return std::atoi(std::getenv("TANDEM_RANK_PORT")); }

// Starts /proc/self/exe with `args` as rank `rank` of `world` meeting on the store at `port`.
inline pid_t SpawnRank(int rank, int world, int port, const std::vector<std::string>& args) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(absl::StrCat("TANDEM_RANK_ID=", rank));
  env_strings.push_back(absl::StrCat("TANDEM_RANK_WORLD=", world));
  env_strings.push_back(absl::StrCat("TANDEM_RANK_PORT=", port));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::vector<std::string> argv_strings = {self};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  return pid;
}

// Waits for `pid` up to `limit`, kills it past that. Its exit code (-signal if killed).
inline int WaitRank(pid_t pid, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1000;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

}  // namespace tandem::comm

#endif  // TANDEM_COMM_RANK_SPAWN_H_
