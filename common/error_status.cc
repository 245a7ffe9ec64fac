#include "common/error_status.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status LibraryError(absl::StatusCode code, absl::string_view library,
                          absl::string_view error_name, absl::string_view description,
                          const CallSite& site) {
  // Keep only the file's base name: Bazel paths are long and sandbox-specific.
  absl::string_view file = site.file;
  if (size_t slash = file.find_last_of('/'); slash != absl::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  return absl::Status(code, absl::StrCat(file, ":", site.line, ": ", library, " error ", error_name,
                                         " (", description, ") in `", site.expression, "`"));
}

}  // namespace tandem
