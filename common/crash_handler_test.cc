#include "common/crash_handler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

namespace tandem {
namespace {

// Recursion the compiler cannot turn into a loop: each frame keeps a buffer it reads back.
int Deep(int n) {
  volatile char frame[512];
  std::memset(const_cast<char*>(frame), n & 0x7f, sizeof(frame));
  return n == 0 ? 0 : Deep(n + 1) + frame[n % sizeof(frame)];
}

void OverflowOnAServerThread() {
  InstallCrashHandler("crash_handler_test");
  std::thread t([] {
    UseAlternateSignalStack();
    std::fprintf(stderr, "%d\n", Deep(1));
  });
  t.join();
}

// A stack overflow on a thread (the JSON-nesting crash was one) still prints the signal and a
// stack trace: the handler runs on the thread's alternate stack.
TEST(CrashHandlerDeathTest, StackOverflowOnAThreadPrintsATrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(OverflowOnAServerThread(), "SIGSEGV(.|\n)*Deep");
}

TEST(CrashHandlerDeathTest, AbortPrintsATrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        InstallCrashHandler("crash_handler_test");
        std::abort();
      },
      "SIGABRT");
}

TEST(CrashHandlerTest, UseAlternateSignalStackIsIdempotent) {
  UseAlternateSignalStack();
  stack_t first{};
  ASSERT_EQ(sigaltstack(nullptr, &first), 0);
  EXPECT_EQ(first.ss_flags & SS_DISABLE, 0);
  UseAlternateSignalStack();
  stack_t second{};
  ASSERT_EQ(sigaltstack(nullptr, &second), 0);
  EXPECT_EQ(first.ss_sp, second.ss_sp);
}

}  // namespace
}  // namespace tandem
