// Python / jinja2 operator semantics on interpreter values: attribute and item access as the
// sandboxed environment resolves them (`x.y` tries methods then items, `x[y]` items then
// attributes, misses give an Undefined carrying jinja2's hint), slicing, arithmetic, `~`,
// comparisons and `in`.
//
// Errors use jinja2's / Python's messages (e.g. "'x' is undefined", "can only concatenate str
// (not \"int\") to str").
//
// Thread safety: pure functions.
#ifndef TANDEM_TOKENIZER_CHAT_OPS_H_
#define TANDEM_TOKENIZER_CHAT_OPS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/chat/value.h"

namespace tandem::tokenizer::chat {

// The error an operation on `undefined` raises (jinja2's UndefinedError).
absl::Status UndefinedError(const Value& undefined);

absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step]; absent parts are Undefined or None.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step);

// op in + - * / // % ** ~
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b);
absl::StatusOr<Value> Negate(const Value& v);
// op in == != < <= > >= in notin
absl::StatusOr<bool> Compare(absl::string_view op, const Value& a, const Value& b);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_OPS_H_
