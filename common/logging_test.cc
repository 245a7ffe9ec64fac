#include "common/logging.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(LoggingTest, RejectsBadOptions) {
  LoggingOptions bad_level;
  bad_level.min_log_level = 4;
  EXPECT_EQ(InitLogging("logging_test", bad_level).code(), absl::StatusCode::kInvalidArgument);
  LoggingOptions bad_verbosity;
  bad_verbosity.verbosity = -1;
  EXPECT_EQ(ApplyLoggingOptions(bad_verbosity).code(), absl::StatusCode::kInvalidArgument);
  LoggingOptions no_dir;
  no_dir.log_to_stderr = false;
  EXPECT_EQ(ApplyLoggingOptions(no_dir).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoggingTest, LogsToStderrWithFileAndLevelFilter) {
  ASSERT_TRUE(InitLogging("logging_test").ok());
  ASSERT_TRUE(InitLogging("logging_test").ok()) << "second init must be harmless";

  testing::internal::CaptureStderr();
  LOG(INFO) << "tandem-info-marker " << 42;
  LOG(WARNING) << "tandem-warning-marker";
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("tandem-info-marker 42"), std::string::npos) << out;
  EXPECT_NE(out.find("logging_test.cc"), std::string::npos) << out;
  EXPECT_NE(out.find("tandem-warning-marker"), std::string::npos) << out;

  LoggingOptions warn_only;
  warn_only.min_log_level = 1;
  ASSERT_TRUE(ApplyLoggingOptions(warn_only).ok());
  testing::internal::CaptureStderr();
  LOG(INFO) << "tandem-dropped-marker";
  LOG(WARNING) << "tandem-kept-marker";
  out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.find("tandem-dropped-marker"), std::string::npos) << out;
  EXPECT_NE(out.find("tandem-kept-marker"), std::string::npos) << out;
  ASSERT_TRUE(ApplyLoggingOptions({}).ok());
}

TEST(LoggingTest, VerbosityGatesVlog) {
  ASSERT_TRUE(InitLogging("logging_test").ok());
  LoggingOptions verbose;
  verbose.verbosity = 2;
  ASSERT_TRUE(ApplyLoggingOptions(verbose).ok());
  testing::internal::CaptureStderr();
  VLOG(2) << "tandem-vlog2-marker";
  VLOG(3) << "tandem-vlog3-marker";
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("tandem-vlog2-marker"), std::string::npos) << out;
  EXPECT_EQ(out.find("tandem-vlog3-marker"), std::string::npos) << out;
  ASSERT_TRUE(ApplyLoggingOptions({}).ok());
}

}  // namespace
}  // namespace tandem
