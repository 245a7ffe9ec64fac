#include "common/daemon.h"

#include <unistd.h>

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

}  // namespace
}  // namespace tandem
