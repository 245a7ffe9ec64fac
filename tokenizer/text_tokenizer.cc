#include "tokenizer/text_tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    auto t = Tokenizer::FromFile((dir / "tokenizer.json").string());
    if (!t.ok()) return t.status();
    return std::unique_ptr<TextTokenizer>(*std::move(t));
  }
  if (std::filesystem::exists(dir / "tokenizer.model")) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir,
        " has only a SentencePiece tokenizer.model: this binary reads tokenizer.json "
        "(SentencePiece models load through LoadTokenizerWithSentencePiece, in processes that do "
        "not link protobuf: Debian's libsentencepiece bundles its own protobuf-lite)"));
  }
  return absl::NotFoundError(
      absl::StrCat(model_dir, " has neither tokenizer.json nor tokenizer.model"));
}

absl::StatusOr<std::string> TextTokenizer::Decode(absl::Span<const int32_t> ids,
                                                  bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    auto piece = TokenBytes(id, skip_special_tokens, /*first=*/bytes.empty());
    if (!piece.ok()) return piece.status();
    bytes += *piece;
  }
  return Utf8Lossy(bytes);
}

absl::StatusOr<std::string> IncrementalDecoder::Add(int32_t id) {
  auto piece = tokenizer_.TokenBytes(id, skip_special_, /*first=*/!started_);
  if (!piece.ok()) return piece.status();
  started_ = started_ || !piece->empty();
  pending_ += *piece;
  const size_t final_bytes = Utf8FinalPrefix(pending_);
  std::string out = Utf8Lossy(absl::string_view(pending_).substr(0, final_bytes));
  pending_.erase(0, final_bytes);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem::tokenizer
