#include "common/daemon.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(DaemonTest, PortFileHoldsTheAddressAndNoTemporaryIsLeft) {
  const std::string path = TempPath("port");
  ASSERT_TRUE(WritePortFile(path, "127.0.0.1:4242").ok());
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "127.0.0.1:4242");
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  EXPECT_EQ(WritePortFile("/nonexistent-dir/port", "x").code(), absl::StatusCode::kUnavailable);
}

TEST(DaemonTest, WaitReturnsTheSignalSentToTheProcess) {
  TerminationSignals signals;
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);  // blocked: stays pending until Wait
  EXPECT_EQ(signals.Wait(), SIGTERM);
}

TEST(DaemonTest, WaitForReturnsTheSignalOrZeroAtTheTimeout) {
  TerminationSignals signals;
  const absl::Time start = absl::Now();
  EXPECT_EQ(signals.WaitFor(absl::Milliseconds(50)), 0);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  EXPECT_EQ(signals.WaitFor(absl::Seconds(10)), SIGINT);
}

// After IgnoreBrokenPipes a write to a socket whose peer closed is EPIPE; without it the
// process dies of SIGPIPE. In a child process, so the test binary's own disposition is untouched.
TEST(DaemonTest, AWriteToAClosedPeerIsEpipeNotDeath) {
  for (const bool ignore : {false, true}) {
    SCOPED_TRACE(ignore ? "ignored" : "default");
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (ignore) IgnoreBrokenPipes();
      int fds[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) _exit(2);
      close(fds[1]);
      const char byte = 'x';
      const ssize_t n = write(fds[0], &byte, 1);
      _exit(n < 0 && errno == EPIPE ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    if (ignore) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE) << "status " << status;
    }
  }
}

// The soft descriptor limit is raised to the hard one (a connection flood then meets the
// operator's limit, not the shell's default of 1,024).
TEST(DaemonTest, RaiseOpenFileLimitLiftsTheSoftLimitToTheHardOne) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max == RLIM_INFINITY || saved.rlim_max < 128)
    GTEST_SKIP() << "no finite hard limit";
  rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  EXPECT_EQ(RaiseOpenFileLimit(), static_cast<uint64_t>(saved.rlim_max));
  rlimit now;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, saved.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace tandem
