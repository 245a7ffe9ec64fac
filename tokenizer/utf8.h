// UTF-8 helpers of the tokenizer: validation (what Encode accepts), the lossy decodings the
// reference decoders apply to byte sequences (Rust's String::from_utf8_lossy: every maximal
// invalid subpart becomes one U+FFFD; SentencePiece: every invalid byte does), and the split an
// incremental decoder needs (how many leading bytes are final: complete characters, or invalid
// subparts that no later byte can complete).
//
// Thread safety: pure functions.
#ifndef TANDEM_TOKENIZER_UTF8_H_
#define TANDEM_TOKENIZER_UTF8_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// OK for valid UTF-8; INVALID_ARGUMENT naming the byte offset of the first invalid sequence.
absl::Status ValidateUtf8(absl::string_view text);

// `bytes` with each maximal invalid subpart replaced by U+FFFD (EF BF BD).
std::string Utf8Lossy(absl::string_view bytes);

// SentencePiece's decoding of a run of byte pieces: each byte that does not begin a valid
// character becomes a U+FFFD of its own (so an incomplete character is one per byte).
std::string Utf8LossyPerByte(absl::string_view bytes);

// The longest prefix of `bytes` whose lossy decoding cannot change when more bytes are appended:
// everything except a trailing incomplete (but so far valid) character.
size_t Utf8FinalPrefix(absl::string_view bytes);

// Appends code point `cp` (<= 0x10FFFF) as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// Decodes the character at bytes[*pos] of VALID UTF-8 and advances *pos.
uint32_t NextCodePoint(absl::string_view text, size_t* pos);

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_UTF8_H_
