// Regex: the patterns of tokenizer.json pre-tokenizers (`Split`, ByteLevel's GPT-2 pattern),
// compiled with PCRE2 (Debian's 10.42) in UTF + UCP mode, JIT where available. PCRE2 has what
// these files need and RE2 lacks (lookahead such as `\s+(?!\S)`), and Unicode classes `\p{L}`,
// `\p{N}`, `\s` by Unicode properties, as Hugging Face's Oniguruma does.
//
// Thread safety: a compiled Regex is immutable; FindAll may be called from many threads (each
// call takes its own match data).
#ifndef TANDEM_TOKENIZER_REGEX_H_
#define TANDEM_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct pcre2_real_code_8;

namespace tandem::tokenizer {

class Regex {
 public:
  // INVALID_ARGUMENT with PCRE2's message and offset for a pattern it cannot compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(absl::string_view pattern);
  ~Regex();

  // Every non-overlapping match in valid UTF-8 `text`, left to right, as [begin, end) byte
  // offsets. An empty match advances by one character (as Hugging Face's find_iter).
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(absl::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, pcre2_real_code_8* code) : pattern_(std::move(pattern)), code_(code) {}
  const std::string pattern_;
  pcre2_real_code_8* const code_;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_REGEX_H_
