// JSON request bodies from the network: nesting is bounded before anything recursive sees them.
//
// nlohmann's parser is iterative, but copying, dumping, comparing and every walk over a parsed
// value recurse once per level: a body of 100 KB nested 50,000 deep overflowed a server thread's
// stack. ParseJsonBody refuses such a body (INVALID_ARGUMENT naming the limit) in one pass over
// its bytes, without recursion, before the parser builds anything.
//
// Thread safety: pure functions.
#ifndef TANDEM_COMMON_HTTP_JSON_BODY_H_
#define TANDEM_COMMON_HTTP_JSON_BODY_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::http {

// The deepest nesting of arrays and objects a request body may have. OpenAI's request shapes need
// fewer than 10 levels; tool schemas a few dozen at most.
inline constexpr int kMaxJsonDepth = 128;

// OK when no array or object in `text` is nested more than `max_depth` levels deep (the top-level
// value is level 1); INVALID_ARGUMENT naming the limit otherwise. Brackets inside strings do not
// count. Says nothing about whether `text` is valid JSON.
absl::Status CheckJsonDepth(std::string_view text, int max_depth = kMaxJsonDepth);

// CheckJsonDepth, then the parse: INVALID_ARGUMENT "the body is not valid JSON" for bad JSON.
absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_JSON_BODY_H_
