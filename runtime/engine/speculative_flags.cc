#include "runtime/engine/speculative_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, speculative_method, "none",
          "speculative decoding drafter: none (off), ngram (prompt lookup over prompt + output), "
          "draft (--draft_model) or mtp (DeepSeek-V3's multi-token prediction layer of --model)");
ABSL_FLAG(int64_t, num_speculative_tokens, 0,
          "drafts verified per request per step (K, 1..16) when --speculative_method is set");
ABSL_FLAG(bool, speculative_adaptive, true,
          "adapt each request's draft length to its acceptance: grow while drafts are accepted, "
          "back off to plain decoding (probing again later) while they are rejected; false: "
          "always draft up to --num_speculative_tokens");
ABSL_FLAG(int64_t, speculative_disable_by_batch_size, 0,
          "no request drafts in a step that starts with at least this many running requests "
          "(0: never)");
ABSL_FLAG(std::string, draft_model, "",
          "--speculative_method=draft: the draft model, a Hugging Face directory of the target's "
          "vocabulary, or dummy:CONFIG[:SEED] (random weights of a preset or config.json)");
ABSL_FLAG(int64_t, ngram_min, 1, "shortest suffix n-gram the n-gram drafter matches");
ABSL_FLAG(int64_t, ngram_max, 4, "longest suffix n-gram the n-gram drafter tries first");

namespace tandem::runtime {

absl::StatusOr<SpeculativeConfig> SpeculativeConfigFromFlags() {
  SpeculativeConfig config;
  ASSIGN_OR_RETURN(config.method, ParseSpeculativeMethod(absl::GetFlag(FLAGS_speculative_method)));
  config.num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  config.adaptive = absl::GetFlag(FLAGS_speculative_adaptive);
  config.disable_by_batch_size = absl::GetFlag(FLAGS_speculative_disable_by_batch_size);
  config.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  config.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  RETURN_IF_ERROR(ValidateSpeculativeConfig(config));
  return config;
}

absl::StatusOr<ModelSource> DraftModelSourceFromFlags() {
  const std::string flag = absl::GetFlag(FLAGS_draft_model);
  if (flag.empty()) {
    return absl::InvalidArgumentError("--speculative_method=draft needs --draft_model");
  }
  ModelSource source;
  if (flag.rfind("dummy:", 0) != 0) {
    source.model_dir = flag;
    return source;
  }
  // dummy:CONFIG[:SEED]; CONFIG may be a path (no ':' in it).
  std::vector<std::string> parts = absl::StrSplit(flag.substr(6), ':');
  if (parts.empty() || parts[0].empty() || parts.size() > 2 ||
      (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &source.dummy_seed))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft_model must be DIR or dummy:CONFIG[:SEED], got '", flag, "'"));
  }
  source.load_format = "dummy";
  source.dummy_config = parts[0];
  return source;
}

}  // namespace tandem::runtime
