#include "common/daemon.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem {

TerminationSignals::TerminationSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int TerminationSignals::Wait() {
  int sig = 0;
  sigwait(&set_, &sig);
  return sig;
}

int TerminationSignals::WaitFor(absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  const int sig = sigtimedwait(&set_, nullptr, &ts);
  return sig > 0 ? sig : 0;  // -1: EAGAIN (timed out) or EINTR (another signal's handler ran)
}

void IgnoreBrokenPipes() { std::signal(SIGPIPE, SIG_IGN); }

absl::Status WritePortFile(const std::string& path, const std::string& address) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    if (!out.good()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void ReturnLargeFreedBlocksToTheSystem() {
  // Setting the threshold turns glibc's dynamic adjustment off; trimming follows it.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 2 << 20);
}

uint64_t RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) {  // the kernel's cap on a process's descriptors is the real one
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    uint64_t cap = 0;
    target = (nr_open >> cap) ? static_cast<rlim_t>(cap) : limit.rlim_cur;
  }
  if (limit.rlim_cur < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

int WithinAQuarterOfTheOpenFileLimit(int configured) {
  configured = std::max(configured, 1);
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return configured;
  return static_cast<int>(
      std::max<rlim_t>(1, std::min<rlim_t>(static_cast<rlim_t>(configured), limit.rlim_cur / 4)));
}

}  // namespace tandem
