#include "tokenizer/text_tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tokenizer {

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    auto t = Tokenizer::FromFile((dir / "tokenizer.json").string());
    if (!t.ok()) return t.status();
    return std::unique_ptr<TextTokenizer>(*std::move(t));
  }
  if (std::filesystem::exists(dir / "tokenizer.model")) {
    auto t = SentencePieceTokenizer::FromFile((dir / "tokenizer.model").string());
    if (!t.ok()) return t.status();
    return std::unique_ptr<TextTokenizer>(*std::move(t));
  }
  return absl::NotFoundError(
      absl::StrCat(model_dir, " has neither tokenizer.json nor tokenizer.model"));
}

absl::StatusOr<std::string> DecodeStream::AddAll(absl::Span<const int32_t> ids) {
  std::string text;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = Add(id);
    if (!piece.ok()) return piece.status();
    text += *piece;
  }
  return text;
}

absl::StatusOr<std::string> TextTokenizer::Decode(absl::Span<const int32_t> ids,
                                                  bool skip_special_tokens) const {
  std::unique_ptr<DecodeStream> stream = NewDecodeStream(skip_special_tokens);
  absl::StatusOr<std::string> text = stream->AddAll(ids);
  if (!text.ok()) return text.status();
  *text += stream->Flush();
  return text;
}

}  // namespace tandem::tokenizer
