#include "runtime/engine/speculative_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, speculative_method, "none",
          "speculative decoding drafter: none (off) or ngram (prompt lookup over prompt + output)");
ABSL_FLAG(int64_t, num_speculative_tokens, 0,
          "drafts verified per request per step (K, 1..16) when --speculative_method is set");
ABSL_FLAG(bool, speculative_adaptive, true,
          "adapt each request's draft length to its acceptance: grow while drafts are accepted, "
          "back off to plain decoding (probing again later) while they are rejected; false: "
          "always draft up to --num_speculative_tokens");
ABSL_FLAG(int64_t, ngram_min, 1, "shortest suffix n-gram the n-gram drafter matches");
ABSL_FLAG(int64_t, ngram_max, 4, "longest suffix n-gram the n-gram drafter tries first");

namespace tandem::runtime {

absl::StatusOr<SpeculativeConfig> SpeculativeConfigFromFlags() {
  SpeculativeConfig config;
  ASSIGN_OR_RETURN(config.method, ParseSpeculativeMethod(absl::GetFlag(FLAGS_speculative_method)));
  config.num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  config.adaptive = absl::GetFlag(FLAGS_speculative_adaptive);
  config.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  config.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  RETURN_IF_ERROR(ValidateSpeculativeConfig(config));
  return config;
}

}  // namespace tandem::runtime
