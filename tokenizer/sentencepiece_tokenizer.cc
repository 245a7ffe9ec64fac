#include "tokenizer/sentencepiece_tokenizer.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's whitespace

}  // namespace

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromFile(
    const std::string& path) {
  std::string error;
  std::unique_ptr<spm::Model> sp = spm::Model::Load(path, &error);
  if (sp == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": ", error));
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(sp)));
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text,
                                                                    bool add_special_tokens) const {
  absl::Status valid = ValidateUtf8(text);
  if (!valid.ok()) return valid;
  std::vector<int> ids;
  std::string error;
  if (!sp_->Encode(std::string(text.data(), text.size()), &ids, &error)) {
    return absl::InternalError(absl::StrCat("sentencepiece encode: ", error));
  }
  std::vector<int32_t> out;
  if (add_special_tokens && sp_->bos_id() >= 0) out.push_back(sp_->bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

absl::StatusOr<std::string> SentencePieceTokenizer::TokenBytes(int32_t id, bool skip_special_tokens,
                                                               bool first) const {
  if (id < 0 || id >= sp_->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
  }
  if (sp_->IsControl(id)) return skip_special_tokens ? std::string() : sp_->Piece(id);
  const std::string& piece = sp_->Piece(id);
  if (sp_->IsByte(id)) {  // "<0xAB>"
    int value = 0;
    if (piece.size() == 6 && absl::SimpleHexAtoi(absl::string_view(piece).substr(3, 2), &value)) {
      return std::string(1, static_cast<char>(value));
    }
    return absl::InternalError(absl::StrCat("byte piece '", piece, "' is not <0xXX>"));
  }
  if (sp_->IsUnknown(id)) return std::string(" \xE2\x81\x87 ");  // SentencePiece's " ⁇ "
  std::string out;
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, 3, kSpace) == 0) {
      out.push_back(' ');
      pos += 3;
    } else {
      out.push_back(piece[pos++]);
    }
  }
  if (first && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

int32_t SentencePieceTokenizer::vocab_size() const { return sp_->size(); }

std::optional<int32_t> SentencePieceTokenizer::TokenToId(absl::string_view token) const {
  const int id = sp_->PieceToId(std::string(token.data(), token.size()));
  if (id == sp_->unk_id() && sp_->Piece(id) != std::string(token.data(), token.size())) {
    return std::nullopt;
  }
  return id;
}

bool SentencePieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < sp_->size() && sp_->IsControl(id);
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizerWithSentencePiece(
    const std::string& model_dir) {
  const std::string json = model_dir + "/tokenizer.json";
  const std::string model = model_dir + "/tokenizer.model";
  if (std::filesystem::exists(json) || !std::filesystem::exists(model)) {
    return LoadTokenizer(model_dir);
  }
  auto t = SentencePieceTokenizer::FromFile(model);
  if (!t.ok()) return t.status();
  return std::unique_ptr<TextTokenizer>(*std::move(t));
}

}  // namespace tandem::tokenizer
