// The shape of a request as the wire limits (tandem/v1/limits.h) bound it, for every model: the
// one check both the router (before routing) and a worker (before its engine sees the request)
// run, so the two cannot drift. Model-dependent checks (vocabulary, maximum length) are the
// router's ValidateAgainstModel and the engine's own.
//
// Thread safety: pure functions.
#ifndef TANDEM_PROTO_TANDEM_V1_REQUEST_SHAPE_H_
#define TANDEM_PROTO_TANDEM_V1_REQUEST_SHAPE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/router.pb.h"

namespace tandem::v1 {

// INVALID_ARGUMENT naming `field` when `value` is longer than kMaxIdBytes.
absl::Status CheckIdLength(absl::string_view field, const std::string& value);

// request_id/cache_salt <= kMaxIdBytes, 1 <= prompt tokens <= kMaxPromptTokens, max_tokens >= 1,
// temperature finite in [0, kMaxTemperature], top_p finite in [0, 1], stop ids <= kMaxStopTokenIds.
// INVALID_ARGUMENT naming the field and value.
absl::Status ValidateRequestShape(const GenerateRequest& request);

}  // namespace tandem::v1

#endif  // TANDEM_PROTO_TANDEM_V1_REQUEST_SHAPE_H_
