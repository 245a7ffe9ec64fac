#include "kvtransfer/testing/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kvtransfer {
namespace {

// Reads exactly `n` bytes before `deadline`.
absl::Status ReadFully(int fd, char* out, size_t n, absl::Time deadline) {
  size_t done = 0;
  while (done < n) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("peer did not send its descriptor");
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (r < 0 && errno != EINTR) return absl::InternalError(std::strerror(errno));
    if (r <= 0) continue;
    const ssize_t got = read(fd, out + done, n - done);
    if (got == 0) return absl::UnavailableError("peer exited before sending its descriptor");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::InternalError(std::strerror(errno));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start(
    const std::string& binary, const std::vector<std::string>& args, absl::Duration timeout) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return absl::InternalError("pipe2 failed");
  }
  // Build argv before fork: the child may only call async-signal-safe functions.
  std::vector<std::string> storage = {binary};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);  // dup2 clears O_CLOEXEC on the new descriptors
    dup2(out[1], STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  std::unique_ptr<PeerProcess> peer(new PeerProcess());
  peer->pid_ = pid;
  peer->stdin_fd_ = in[1];
  peer->stdout_fd_ = out[0];

  const absl::Time deadline = absl::Now() + timeout;
  char header[8];
  if (absl::Status s = ReadFully(peer->stdout_fd_, header, sizeof(header), deadline); !s.ok()) {
    return s;
  }
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | static_cast<uint8_t>(header[i]);
  if (size > (uint64_t{16} << 20)) return absl::InternalError("descriptor too large");
  std::string bytes(size, '\0');
  if (absl::Status s = ReadFully(peer->stdout_fd_, bytes.data(), size, deadline); !s.ok()) {
    return s;
  }
  if (!peer->descriptor_.ParseFromString(bytes)) {
    return absl::InternalError("peer sent an unparsable descriptor");
  }
  return peer;
}

absl::Status PeerProcess::Send(const std::string& bytes) {
  std::string framed(8, '\0');
  for (int i = 0; i < 8; ++i) framed[i] = static_cast<char>(uint64_t{bytes.size()} >> (8 * i));
  framed += bytes;
  size_t done = 0;
  while (done < framed.size()) {
    const ssize_t n = write(stdin_fd_, framed.data() + done, framed.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("cannot write to the peer's stdin");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

PeerProcess::~PeerProcess() {
  Stop();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool PeerProcess::Running() {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void PeerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int PeerProcess::Stop() {
  if (stdin_fd_ >= 0) {
    close(stdin_fd_);
    stdin_fd_ = -1;
  }
  if (pid_ <= 0) return -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  Kill();
  return -1;
}

std::string SiblingBinary(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    std::string path = absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "tandem",
                                    "/kvtransfer/", name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, static_cast<size_t>(n));
  return absl::StrCat(dir.substr(0, dir.rfind('/')), "/", name);
}

}  // namespace tandem::kvtransfer
