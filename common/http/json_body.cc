#include "common/http/json_body.h"

#include "absl/strings/str_cat.h"

namespace tandem::http {

absl::Status CheckJsonDepth(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat("the body nests JSON arrays/objects deeper than the limit of ",
                           max_depth, " levels"));
        }
        break;
      case ']':
      case '}':
        // Unbalanced closers are the parser's to refuse; depth only counts what is open.
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view text, int max_depth) {
  if (absl::Status depth = CheckJsonDepth(text, max_depth); !depth.ok()) return depth;
  nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  return body;
}

}  // namespace tandem::http
