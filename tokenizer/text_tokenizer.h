// TextTokenizer: what serving needs of a tokenizer, whatever its file format — Hugging Face
// tokenizer.json (tokenizer.h) or a SentencePiece model (sentencepiece_tokenizer.h) — and the
// IncrementalDecoder that streams its output. LoadTokenizer picks the implementation for a model
// directory.
//
// Thread safety: const methods may be called concurrently; an IncrementalDecoder is one stream's.
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

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // INVALID_ARGUMENT for text that is not valid UTF-8 (naming the byte offset).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      bool add_special_tokens) const = 0;
  // The lossy UTF-8 decoding of the ids' TokenBytes (invalid sequences -> U+FFFD, as Hugging
  // Face's decoders). INVALID_ARGUMENT for an id outside the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // The bytes token `id` adds to a decoded text; `first`: no byte has been produced before it
  // (decoders that drop a leading space do it here). Decode(ids) == Utf8Lossy(concatenation).
  virtual absl::StatusOr<std::string> TokenBytes(int32_t id, bool skip_special_tokens,
                                                 bool first) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> TokenToId(absl::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
};

// The tokenizer.json of a model directory. NOT_FOUND naming the directory when it has none;
// UNIMPLEMENTED when it has only a SentencePiece tokenizer.model (see
// LoadTokenizerWithSentencePiece, sentencepiece_tokenizer.h).
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const std::string& model_dir);

// Streams a decoded text token by token: Add returns only complete UTF-8 (a character split over
// tokens, or a byte-fallback sequence, is held back until it completes), and the concatenation
// of every Add and the final Flush equals TextTokenizer::Decode of all the ids.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const TextTokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  absl::StatusOr<std::string> Add(int32_t id);
  // What is held back, decoded lossily (the stream ended).
  std::string Flush();

 private:
  const TextTokenizer& tokenizer_;
  const bool skip_special_;
  bool started_ = false;  // some byte was produced
  std::string pending_;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_TEXT_TOKENIZER_H_
