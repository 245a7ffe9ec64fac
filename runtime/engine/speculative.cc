#include "runtime/engine/speculative.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(absl::string_view name) {
  if (name.empty() || name == "none") return SpeculativeMethod::kNone;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "draft") return SpeculativeMethod::kDraft;
  if (name == "mtp") return SpeculativeMethod::kMtp;
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative_method must be none, ngram, draft or mtp, got '", name, "'"));
}

const char* SpeculativeMethodName(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone:
      return "none";
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kDraft:
      return "draft";
    case SpeculativeMethod::kMtp:
      return "mtp";
  }
  return "unknown";
}

absl::Status ValidateSpeculativeConfig(const SpeculativeConfig& config) {
  if (config.method == SpeculativeMethod::kNone) {
    if (config.num_speculative_tokens < 0) {
      return absl::InvalidArgumentError("--num_speculative_tokens must not be negative");
    }
    return absl::OkStatus();
  }
  if (config.num_speculative_tokens < 1 || config.num_speculative_tokens > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_speculative_tokens must be in [1, 16] with --speculative_method=",
        SpeculativeMethodName(config.method), ", got ", config.num_speculative_tokens));
  }
  if (config.disable_by_batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative_disable_by_batch_size must be >= 0, got ", config.disable_by_batch_size));
  }
  if (config.max_pause_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pause_steps must be >= 1, got ", config.max_pause_steps));
  }
  if (config.ngram_min < 1 || config.ngram_min > config.ngram_max || config.ngram_max > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1 <= --ngram_min <= --ngram_max <= 64, got ", config.ngram_min, " and ",
                     config.ngram_max));
  }
  return absl::OkStatus();
}

std::vector<int32_t> NgramDraft(absl::Span<const int32_t> tokens, const SpeculativeConfig& config,
                                int64_t max_tokens) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min(config.ngram_max, len - 1); n >= config.ngram_min; --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(len - n, n);
    // Latest earlier occurrence first (it starts before len - n: not the suffix itself), but one
    // followed by max_tokens tokens wins over later ones the end cuts short (in a loop of period
    // p the latest match is followed by only p tokens).
    int64_t best_from = -1, best_take = 0;
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t take = std::min(max_tokens, len - from);
      if (take > best_take) {
        best_from = from;
        best_take = take;
      }
      if (take == max_tokens) break;
    }
    if (best_from >= 0) {
      return std::vector<int32_t>(tokens.begin() + best_from,
                                  tokens.begin() + best_from + best_take);
    }
  }
  return {};
}

int64_t AcceptedDraftLength(absl::Span<const int32_t> drafts,
                            absl::Span<const int32_t> target_samples) {
  int64_t a = 0;
  while (a < static_cast<int64_t>(drafts.size()) &&
         a < static_cast<int64_t>(target_samples.size()) && drafts[a] == target_samples[a]) {
    ++a;
  }
  return a;
}

int64_t NextDraftLength(const SpeculativeConfig& config, DraftLengthState* state) {
  if (!config.adaptive) return config.num_speculative_tokens;
  if (state->draft_len < 0) state->draft_len = config.num_speculative_tokens;
  if (state->paused > 0) {
    --state->paused;
    return 0;
  }
  return state->draft_len;
}

void UpdateDraftLength(const SpeculativeConfig& config, int64_t drafted, int64_t accepted,
                       DraftLengthState* state) {
  if (!config.adaptive || drafted <= 0) return;
  if (accepted > 0) state->pause = 1;
  if (accepted >= drafted) {
    state->draft_len =
        std::min(config.num_speculative_tokens, std::max(state->draft_len, drafted) + 1);
    return;
  }
  if (accepted > 0) return;
  state->draft_len = std::min(state->draft_len, drafted) / 2;
  if (state->draft_len > 0) return;
  // Nothing accepted at one draft: pause, then probe with one draft.
  state->paused = state->pause;
  state->pause = std::min(config.max_pause_steps, 2 * state->pause);
  state->draft_len = 1;
}

double SpecStats::acceptance_rate() const {
  return drafted_tokens == 0
             ? 0.0
             : static_cast<double>(accepted_tokens) / static_cast<double>(drafted_tokens);
}

double SpecStats::mean_accepted_length() const {
  return verify_passes == 0
             ? 0.0
             : 1.0 + static_cast<double>(accepted_tokens) / static_cast<double>(verify_passes);
}

}  // namespace tandem::runtime
