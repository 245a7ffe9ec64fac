// SentencePieceTokenizer: a SentencePiece `.model` (Llama-2, Mistral v1/v3 tokenizer.model)
// through Debian's libsentencepiece — the kept library, not a rewrite. Encode adds the model's
// BOS with add_special_tokens (as Hugging Face's Llama/Mistral tokenizers do); Decode and
// TokenBytes follow SentencePiece's decoder (U+2581 -> space, <0xXX> byte pieces -> bytes, the
// first piece's leading space dropped); control pieces (<s>, </s>) render as their text unless
// skipped.
//
// Link caveat: Debian's libsentencepiece.so exports a bundled protobuf-lite; loaded into a process
// with the system libprotobuf (anything with gRPC) the two interpose and crash at start-up. So
// this is its own target, kept out of the router and the workers; isolating it (dlmopen of a
// C-ABI wrapper) is the way to serve SentencePiece-only models from the router.
//
// Thread safety: const methods may be called concurrently (SentencePieceProcessor's are const).
#ifndef TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/sentencepiece_shim.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::tokenizer {

class SentencePieceTokenizer final : public TextTokenizer {
 public:
  // NOT_FOUND / INVALID_ARGUMENT with SentencePiece's message for a missing or bad model file.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromFile(const std::string& path);
  ~SentencePieceTokenizer() override;

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  absl::StatusOr<std::string> TokenBytes(int32_t id, bool skip_special_tokens,
                                         bool first) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override;

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<spm::Model> sp) : sp_(std::move(sp)) {}
  std::unique_ptr<spm::Model> sp_;
};

// LoadTokenizer, plus tokenizer.model (SentencePiece) when the directory has no tokenizer.json.
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizerWithSentencePiece(
    const std::string& model_dir);

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
