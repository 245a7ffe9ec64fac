// Process logging setup on top of glog (Debian's libgoogle-glog-dev; Abseil 20220623 has no
// absl/log). Daemons and tools call InitLogging() once at the top of main(); code logs with
// glog's LOG(INFO/WARNING/ERROR) and VLOG(n).
//
// Thread safety: InitLogging() may be called from any thread; only the first call initializes
// glog (glog itself is process-wide). ApplyLoggingOptions() may be called again later, e.g.
// after flag parsing, and from tests.
#ifndef TANDEM_COMMON_LOGGING_H_
#define TANDEM_COMMON_LOGGING_H_

#include <glog/logging.h>

#include <string>

#include "absl/status/status.h"

namespace tandem {

struct LoggingOptions {
  // 0 = INFO, 1 = WARNING, 2 = ERROR, 3 = FATAL. Messages below it are dropped.
  int min_log_level = 0;
  // VLOG(n) prints when n <= verbosity.
  int verbosity = 0;
  // Logs go to stderr (the launcher captures them); when false glog writes files to log_dir.
  bool log_to_stderr = true;
  std::string log_dir;
  // Dump a stack trace on SIGSEGV/SIGABRT/... before dying, stack overflows included
  // (common/crash_handler.h).
  bool install_failure_handler = true;
};

// Validates options: INVALID_ARGUMENT for a level outside [0, 3], a negative verbosity, or
// file logging without a log_dir.
absl::Status ValidateLoggingOptions(const LoggingOptions& options);

// Initializes glog for this process (first call only) and applies `options`.
absl::Status InitLogging(const char* argv0, const LoggingOptions& options = {});

// Applies `options` to an already initialized process.
absl::Status ApplyLoggingOptions(const LoggingOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOGGING_H_
