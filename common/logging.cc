#include "common/logging.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/crash_handler.h"
#include "common/status_macros.h"

namespace tandem {

absl::Status ValidateLoggingOptions(const LoggingOptions& options) {
  if (options.min_log_level < 0 || options.min_log_level > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_log_level must be in [0, 3], got ", options.min_log_level));
  }
  if (options.verbosity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("verbosity must be >= 0, got ", options.verbosity));
  }
  if (!options.log_to_stderr && options.log_dir.empty()) {
    return absl::InvalidArgumentError("log_to_stderr=false needs a log_dir to write files to");
  }
  return absl::OkStatus();
}

absl::Status ApplyLoggingOptions(const LoggingOptions& options) {
  RETURN_IF_ERROR(ValidateLoggingOptions(options));
  // glog keeps its configuration in process-wide flags; this is the one place we set them.
  FLAGS_minloglevel = options.min_log_level;
  FLAGS_v = options.verbosity;
  FLAGS_logtostderr = options.log_to_stderr;
  FLAGS_log_dir = options.log_dir;
  return absl::OkStatus();
}

absl::Status InitLogging(const char* argv0, const LoggingOptions& options) {
  RETURN_IF_ERROR(ValidateLoggingOptions(options));
  // glog aborts if initialized twice; the once-flag is the only process-wide state we keep,
  // mirroring glog's own.
  static std::once_flag once;
  std::call_once(once, [&] {
    google::InitGoogleLogging(argv0 != nullptr ? argv0 : "tandem");
    if (options.install_failure_handler) InstallCrashHandler(argv0);
  });
  return ApplyLoggingOptions(options);
}

}  // namespace tandem
