// TextTokenizer: what serving needs of a tokenizer, whatever its file format — Hugging Face
// tokenizer.json (tokenizer.h) or a SentencePiece model (sentencepiece_tokenizer.h) — and the
// IncrementalDecoder that streams its output. LoadTokenizer picks the implementation for a model
// directory.
//
// Decoding is defined once, as a stream (DecodeStream): Decode(ids) is a stream fed every id
// and flushed, so a streamed text and a whole decoding are equal by construction. Each
// implementation's stream follows its reference decoder exactly, including what neighbouring
// tokens change (a byte-fallback run decodes as a whole; a leading space is dropped once).
//
// Thread safety: const methods may be called concurrently; a DecodeStream (and an
// IncrementalDecoder) is one stream's.
#ifndef TANDEM_TOKENIZER_TEXT_TOKENIZER_H_
#define TANDEM_TOKENIZER_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::tokenizer {

// One decoding in progress: token ids in, text out.
class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  // The text that `id` makes final: only whole UTF-8 characters that no later token can change
  // (a character split over tokens, or a byte-fallback run, waits until it is complete).
  // INVALID_ARGUMENT for an id outside the vocabulary (the stream is unchanged).
  virtual absl::StatusOr<std::string> Add(int32_t id) = 0;
  // Add of each id in turn, concatenated (what Decode uses; a stream may do it faster). After an
  // error the stream is not to be used further.
  virtual absl::StatusOr<std::string> AddAll(absl::Span<const int32_t> ids);
  // The rest (the stream ended): what was held back, decoded as the reference decoder does at
  // the end of a text (e.g. an incomplete character -> U+FFFD).
  virtual std::string Flush() = 0;
};

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // INVALID_ARGUMENT for text that is not valid UTF-8 (naming the byte offset).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      bool add_special_tokens) const = 0;
  // The reference decoder's text for `ids` (always valid UTF-8). INVALID_ARGUMENT for an id
  // outside the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // A decoding of this tokenizer's ids (which must outlive the stream).
  virtual std::unique_ptr<DecodeStream> NewDecodeStream(bool skip_special_tokens) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> TokenToId(absl::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
};

// The tokenizer of a model directory: tokenizer.json (tokenizer.h) when there is one, else a
// SentencePiece tokenizer.model (sentencepiece_tokenizer.h: needs libtandem_spm.so, see
// sentencepiece_library.h). NOT_FOUND naming the directory when it has neither.
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const std::string& model_dir);

// Streams a decoded text token by token (a DecodeStream of `tokenizer`): the concatenation of
// every Add and the final Flush equals TextTokenizer::Decode of all the ids.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const TextTokenizer& tokenizer, bool skip_special_tokens)
      : stream_(tokenizer.NewDecodeStream(skip_special_tokens)) {}
  absl::StatusOr<std::string> Add(int32_t id) { return stream_->Add(id); }
  // What is held back, decoded (the stream ended).
  std::string Flush() { return stream_->Flush(); }

 private:
  std::unique_ptr<DecodeStream> stream_;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_TEXT_TOKENIZER_H_
