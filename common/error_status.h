// Shared formatting for errors converted from C libraries (CUDA, cuBLAS, NCCL, UCX).
//
// Every converted status reads
//   "<file>:<line>: <library> error <name> (<description>) in `<expression>`"
// so a log line points at the call site, the library's own name for the error, and the call.
#ifndef TANDEM_COMMON_ERROR_STATUS_H_
#define TANDEM_COMMON_ERROR_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Where an error was observed; built by the *_RETURN_IF_ERROR macros from __FILE__/__LINE__.
struct CallSite {
  absl::string_view expression;
  absl::string_view file;
  int line = 0;
};

// REQUIRES: code != absl::StatusCode::kOk.
absl::Status LibraryError(absl::StatusCode code, absl::string_view library,
                          absl::string_view error_name, absl::string_view description,
                          const CallSite& site);

}  // namespace tandem

#endif  // TANDEM_COMMON_ERROR_STATUS_H_
