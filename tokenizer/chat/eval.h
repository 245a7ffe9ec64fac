// Renders a parsed template (ast.h) against a context: a tree-walking evaluator with jinja2's
// scoping (a `for` iteration is a scope of its own, `if` is not; `set` writes the innermost
// scope; namespaces are shared), loop variables, break/continue, and errors as absl::Status
// (raise_exception's message comes back as INVALID_ARGUMENT).
//
// Thread safety: Render is reentrant; the tree is only read.
#ifndef TANDEM_TOKENIZER_CHAT_EVAL_H_
#define TANDEM_TOKENIZER_CHAT_EVAL_H_

#include <string>

#include "absl/status/statusor.h"
#include "tokenizer/chat/ast.h"
#include "tokenizer/chat/value.h"

namespace tandem::tokenizer::chat {

// `context` must be a dict: its keys are the template's variables.
absl::StatusOr<std::string> RenderBody(const Body& body, const Value& context);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_EVAL_H_
