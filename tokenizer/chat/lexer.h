// Tokenizes a Jinja template the way jinja2's lexer does under transformers' settings
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False): template data, `{{ }}`,
// `{% %}` (comments dropped), with the whitespace control of `-` / `+` markers applied to the
// data tokens, and the expression tokens inside tags.
//
// Thread safety: pure function.
#ifndef TANDEM_TOKENIZER_CHAT_LEXER_H_
#define TANDEM_TOKENIZER_CHAT_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::tokenizer::chat {

struct Token {
  enum class Type {
    kText,        // Template data (text holds it, whitespace control applied).
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifier (text)
    kString,      // string literal (text holds the unescaped value)
    kInt,         // int_value
    kFloat,       // float_value
    kOp,          // operator / punctuation (text)
    kEof,
  };
  Type type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_LEXER_H_
