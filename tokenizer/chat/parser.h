// Parses the token stream of lexer.h into the statement tree of ast.h (jinja2's grammar and
// operator precedence). Tags, filters and tests outside the supported subset fail here with an
// UNIMPLEMENTED error naming them; syntax errors are INVALID_ARGUMENT with the line.
//
// Thread safety: pure function.
#ifndef TANDEM_TOKENIZER_CHAT_PARSER_H_
#define TANDEM_TOKENIZER_CHAT_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/chat/ast.h"
#include "tokenizer/chat/lexer.h"

namespace tandem::tokenizer::chat {

absl::StatusOr<Body> ParseTemplate(const std::vector<Token>& tokens);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_PARSER_H_
