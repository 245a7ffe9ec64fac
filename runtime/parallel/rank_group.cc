#include "runtime/parallel/rank_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace tandem::runtime {
namespace {

struct HostPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostPort> ParseDistInit(const std::string& text) {
  const size_t colon = text.rfind(':');
  HostPort out;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &out.port) || out.port <= 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist_init must be HOST:PORT (rank 0's rendezvous), got '", text, "'"));
  }
  out.host = text.substr(0, colon);
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// Starts rank `rank` of `size` as a copy of this process; it dies when this process does.
// `shm_fd` (>= 0): rank 0's plan segment, inherited by the child (--dist_shm_fd).
absl::StatusOr<pid_t> SpawnRank(const std::vector<std::string>& argv, int rank, int size, int port,
                                int device, int shm_fd) {
  std::vector<std::string> args = argv;
  args.push_back(absl::StrCat("--rank=", rank));
  args.push_back(absl::StrCat("--world_size=", size));
  args.push_back(absl::StrCat("--dist_init=127.0.0.1:", port));
  args.push_back("--dist_bind=127.0.0.1");
  args.push_back(absl::StrCat("--device=", device));
  if (shm_fd >= 0) args.push_back(absl::StrCat("--dist_shm_fd=", shm_fd));
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);                            // the parent died before prctl
    if (shm_fd >= 0 && fcntl(shm_fd, F_SETFD, 0) != 0) _exit(1);  // inherit it across exec
    execv("/proc/self/exe", cargv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Join(const RankGroupOptions& options,
                                                           const std::vector<std::string>& argv) {
  if (options.tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be >= 1, got ", options.tp));
  }
  const bool launched = options.rank >= 0;
  const int size = launched && options.world_size > 0 ? options.world_size : options.tp;
  if (launched && options.world_size > 0 && options.tp != 1 && options.tp != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size=", options.world_size,
                                                   " disagrees with --tp=", options.tp,
                                                   " (a group has --tp ranks in all)"));
  }
  if (options.dcp < 1 || size % options.dcp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp=", options.dcp, " must divide the group of --tp=", size,
        " ranks (a group has --tp ranks in all; --tp=2 --dcp=2 is two ranks, each with all "
        "heads and half of every request's tokens)"));
  }
  if (options.dcp_interleave < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp_interleave must be >= 0 (0: the block size), got ", options.dcp_interleave));
  }
  if (launched && options.rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank=", options.rank, " is outside a group of ", size, " ranks"));
  }
  if (!launched && !options.dist_init.empty() && size > 1) {
    return absl::InvalidArgumentError(
        "--dist_init needs --rank (each rank started by a launcher); without --rank, --tp "
        "starts the ranks on this host itself");
  }
  const int rank = launched ? options.rank : 0;
  std::unique_ptr<RankGroup> out(new RankGroup(rank, size, options.device));
  out->timeout_ = options.timeout;
  if (size == 1) return out;

  comm::GlooGroupOptions gloo;
  gloo.rank = rank;
  gloo.world_size = size;
  gloo.timeout = options.timeout;
  if (launched) {
    ASSIGN_OR_RETURN(HostPort init, ParseDistInit(options.dist_init));
    gloo.store_host = init.host;
    gloo.store_port = init.port;
    gloo.serve_store = rank == 0;
    if (options.plan_shm_fd >= 0) {
      // Started by rank 0 on its host: map its plan segment before joining (rank 0 knows every
      // rank mapped it once the group exists).
      ASSIGN_OR_RETURN(out->plan_segment_, PlanSegment::Attach(options.plan_shm_fd));
    }
    if (!options.dist_bind.empty()) {
      gloo.bind_host = options.dist_bind;
    } else if (IsLoopback(init.host)) {
      gloo.bind_host = "127.0.0.1";
    } else {
      ASSIGN_OR_RETURN(gloo.bind_host, FirstNonLoopbackAddress());
    }
  } else {
    // One host: serve the rendezvous on loopback, then start the other ranks against it.
    ASSIGN_OR_RETURN(out->store_, comm::TcpStoreServer::Start("127.0.0.1", 0));
    gloo.store_host = "127.0.0.1";
    gloo.store_port = out->store_->port();
    gloo.serve_store = false;
    gloo.bind_host = "127.0.0.1";
    if (options.plan_segment) {
      absl::StatusOr<std::unique_ptr<PlanSegment>> segment = PlanSegment::Create(size);
      if (segment.ok()) {
        out->plan_segment_ = *std::move(segment);
      } else {
        LOG(WARNING) << "worker group: no shared memory for the plan, using the group's "
                        "broadcast: "
                     << segment.status();
      }
    }
    const int shm_fd = out->plan_segment_ != nullptr ? out->plan_segment_->fd() : -1;
    for (int r = 1; r < size; ++r) {
      ASSIGN_OR_RETURN(
          pid_t pid, SpawnRank(argv, r, size, gloo.store_port,
                               options.share_device ? options.device : options.device + r, shm_fd));
      out->children_.push_back(pid);
    }
  }
  out->bind_host_ = gloo.bind_host;
  out->store_host_ = gloo.store_host;
  out->store_port_ = gloo.store_port;
  ASSIGN_OR_RETURN(out->group_, comm::GlooProcessGroup::Create(gloo));
  LOG(INFO) << "worker group: rank " << rank << " of " << size << " joined (collectives on "
            << gloo.bind_host << ", plan over "
            << (out->plan_segment_ != nullptr ? "shared memory" : "the group") << ")";
  return out;
}

absl::Status RankGroup::CheckRanksAlive() const {
  for (size_t i = 0; i < children_.size(); ++i) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(children_[i]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == children_[i]) {
      const bool killed = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
      return absl::UnavailableError(
          absl::StrCat("worker group: rank ", i + 1, " (pid ", children_[i], ") ",
                       killed ? absl::StrCat("was killed by signal ", info.si_status)
                              : absl::StrCat("exited with status ", info.si_status)));
    }
  }
  return absl::OkStatus();
}

void RankGroup::KillRanks() {
  for (pid_t pid : children_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  children_.clear();
}

RankGroup::~RankGroup() {
  if (children_.empty()) return;
  // A working group told its ranks to shut down: give them time to exit. A broken one cannot
  // have: a wedged rank would never exit, so kill at once.
  const bool healthy = group_ != nullptr && group_->status().ok();
  const absl::Time deadline = absl::Now() + (healthy ? absl::Seconds(10) : absl::ZeroDuration());
  std::vector<pid_t> left = children_;
  while (!left.empty() && absl::Now() < deadline) {
    std::vector<pid_t> still;
    for (pid_t pid : left) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == 0) still.push_back(pid);
    }
    left.swap(still);
    if (!left.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  for (pid_t pid : left) {
    LOG(WARNING) << "worker group: rank process " << pid << " did not exit; killing it";
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  group_.reset();
  store_.reset();
}

}  // namespace tandem::runtime
