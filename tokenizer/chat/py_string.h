// Python string semantics the chat-template interpreter needs, on UTF-8 text: code-point length
// and slicing, str.strip/split, case mapping (ICU, full mappings like Python's), repr() quoting,
// float repr (shortest round-trip, Python's layout) and json.dumps string escaping.
//
// Thread safety: pure functions.
#ifndef TANDEM_TOKENIZER_CHAT_PY_STRING_H_
#define TANDEM_TOKENIZER_CHAT_PY_STRING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer::chat {

// Byte offsets of the code points of `s` (one entry per code point, plus s.size() at the end).
// Invalid bytes count as one code point each.
std::vector<size_t> CodePointOffsets(absl::string_view s);
// Number of code points (len() of a Python str).
size_t CodePointLength(absl::string_view s);

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);

// str.strip / lstrip / rstrip; `chars` absent strips whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split(sep, maxsplit) (sep absent: whitespace runs); str.rsplit when `from_right`.
std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);
// str.splitlines() (no keepends).
std::vector<std::string> PySplitLines(absl::string_view s);
// str.replace(old, new, count) (count < 0: all).
std::string PyReplace(absl::string_view s, absl::string_view old_text, absl::string_view new_text,
                      int64_t count);

std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
// str.capitalize(): first character upper, rest lower.
std::string PyCapitalize(absl::string_view s);
// str.title().
std::string PyTitle(absl::string_view s);
// jinja2's `title` filter (words start after whitespace or one of "-({[<").
std::string JinjaTitle(absl::string_view s);

// Python's repr(str).
void AppendPyStrRepr(absl::string_view s, std::string* out);
// Python's repr(float).
std::string PyFloatRepr(double d);
// json.dumps(str) with the given ensure_ascii.
void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_PY_STRING_H_
