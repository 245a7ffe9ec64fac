#include "tandem/v1/request_shape.h"

#include "absl/strings/str_cat.h"
#include "tandem/v1/limits.h"

namespace tandem::v1 {

absl::Status CheckIdLength(absl::string_view field, const std::string& value) {
  if (value.size() > static_cast<size_t>(kMaxIdBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value.size(), " bytes; the limit is ", kMaxIdBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestShape(const GenerateRequest& request) {
  if (absl::Status s = CheckIdLength("request_id", request.request_id()); !s.ok()) return s;
  if (absl::Status s = CheckIdLength("cache_salt", request.cache_salt()); !s.ok()) return s;
  const int prompt_len = request.prompt_token_ids_size();
  if (prompt_len == 0) return absl::InvalidArgumentError("prompt_token_ids is empty");
  if (prompt_len > kMaxPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_len, " tokens; the limit is ", kMaxPromptTokens));
  }
  const SamplingParams& sp = request.sampling();
  if (sp.max_tokens() < 1) {
    return absl::InvalidArgumentError("sampling.max_tokens must be >= 1, got 0");
  }
  // Written as !(in range) so NaN fails too.
  if (!(sp.temperature() >= 0.0f && sp.temperature() <= kMaxTemperature)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.temperature must be in [0, ",
                                                   kMaxTemperature, "], got ", sp.temperature()));
  }
  if (!(sp.top_p() >= 0.0f && sp.top_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in [0, 1] (0 = off), got ", sp.top_p()));
  }
  if (sp.stop_token_ids_size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids has ",
                                                   sp.stop_token_ids_size(), " ids; the limit is ",
                                                   kMaxStopTokenIds));
  }
  return absl::OkStatus();
}

}  // namespace tandem::v1
