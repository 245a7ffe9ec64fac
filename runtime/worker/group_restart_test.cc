#include "runtime/worker/group_restart.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

constexpr char kChildFdEnv[] = "TANDEM_GROUP_RESTART_TEST_FD";

TEST(GroupRestartTest, ABrokenGroupEndsTheWaitWithItsError) {
  TerminationSignals signals;
  int calls = 0;
  const ServeEnd end = WaitForSignalOrBrokenGroup(
      signals,
      [&calls] {
        return ++calls < 4 ? absl::OkStatus() : absl::UnavailableError("rank 1 was killed");
      },
      absl::Milliseconds(5));
  EXPECT_EQ(end.signal, 0);
  EXPECT_EQ(end.broken.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(end.broken.message(), "rank 1 was killed");
  EXPECT_EQ(calls, 4);
}

TEST(GroupRestartTest, ASignalEndsTheWaitWhileTheGroupIsHealthy) {
  TerminationSignals signals;
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);  // blocked: pending until the wait takes it
  const ServeEnd end = WaitForSignalOrBrokenGroup(
      signals, [] { return absl::OkStatus(); }, absl::Seconds(5));
  EXPECT_EQ(end.signal, SIGTERM);
  EXPECT_TRUE(end.broken.ok());
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  EXPECT_EQ(WaitForSignalOrBrokenGroup(signals, nullptr).signal, SIGINT);  // no group: signal only
}

TEST(GroupRestartTest, QuickRestartsBackOffUpToThirtySeconds) {
  EXPECT_EQ(GroupRestartDelay(0), absl::ZeroDuration());
  EXPECT_EQ(GroupRestartDelay(1), absl::ZeroDuration());
  EXPECT_EQ(GroupRestartDelay(2), absl::Seconds(1));
  EXPECT_EQ(GroupRestartDelay(3), absl::Seconds(2));
  EXPECT_EQ(GroupRestartDelay(6), absl::Seconds(16));
  EXPECT_EQ(GroupRestartDelay(7), absl::Seconds(30));
  EXPECT_EQ(GroupRestartDelay(1000), absl::Seconds(30));
}

// Runs only in the process ExecSelf made (below): the listening socket the parent left open
// without FD_CLOEXEC must not have come along.
TEST(GroupRestartTest, ExecedChildHasNoInheritedDescriptor) {
  const char* fd_text = std::getenv(kChildFdEnv);
  if (fd_text == nullptr) GTEST_SKIP() << "runs in the re-executed child only";
  const int fd = std::atoi(fd_text);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "descriptor " << fd << " survived the exec";
}

TEST(GroupRestartTest, ExecSelfRunsThisBinaryAgainWithoutItsDescriptors) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A listening socket, inheritable: what a rank's transport could leave behind.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd, 1) != 0) {
      _exit(3);
    }
    setenv(kChildFdEnv, std::to_string(fd).c_str(), 1);
    // The child is a gtest run of its own: keep it off this run's result files.
    for (const char* var : {"GTEST_OUTPUT", "XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE"}) {
      unsetenv(var);
    }
    const absl::Status s =
        ExecSelf({"/proc/self/exe"},
                 {"--gtest_filter=GroupRestartTest.ExecedChildHasNoInheritedDescriptor"});
    (void)s;
    _exit(4);  // exec failed
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: no socket, 4: exec failed, 1: the descriptor survived";
}

}  // namespace
}  // namespace tandem::runtime
