// The builtins chat templates call: jinja2 filters (with transformers' `tojson`), jinja2 tests,
// the str/dict methods the sandbox allows, and the globals transformers installs
// (raise_exception, strftime_now, namespace, dict) plus jinja2's range.
//
// Filters and tests outside the supported set are rejected at parse time (parser.cc asks
// IsSupportedFilter / IsSupportedTest); mutating methods (list.append, dict.update, ...) fail
// as the ImmutableSandboxedEnvironment makes them fail.
//
// Thread safety: pure functions (strftime_now reads the clock).
#ifndef TANDEM_TOKENIZER_CHAT_BUILTINS_H_
#define TANDEM_TOKENIZER_CHAT_BUILTINS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/chat/value.h"

namespace tandem::tokenizer::chat {

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Positional argument `index`, else keyword `name`; nullptr when neither was given.
  const Value* Get(size_t index, absl::string_view name) const;
};

bool IsSupportedFilter(absl::string_view name);
bool IsSupportedTest(absl::string_view name);
// Names callable as functions when no variable shadows them.
bool IsGlobalFunction(absl::string_view name);

// Whether `obj.name` is a method (of a str, dict or list); an error for methods the sandbox
// forbids (mutating ones).
absl::StatusOr<bool> IsMethod(const Value& obj, absl::string_view name);

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, const CallArgs& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, const CallArgs& args);
// Calls a Callable value: a bound method or a global function.
absl::StatusOr<Value> CallValue(const Callable& callable, const CallArgs& args);
absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& args);

// Python's iter(x) materialized: list items, str characters, dict keys; Undefined is empty.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_BUILTINS_H_
