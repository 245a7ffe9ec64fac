#include "tokenizer/sentencepiece_tokenizer.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's whitespace

// SentencePiece's Decode, one piece at a time (sentencepiece_processor.cc, Decode):
// byte pieces gather into a run that is decoded when a non-byte piece (or the end) comes; the
// first piece that starts with U+2581 while no text has been produced loses it (with a
// model that removes extra whitespace, every such piece until some text appears).
class SentencePieceStream final : public DecodeStream {
 public:
  SentencePieceStream(const SentencePieceTokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  absl::StatusOr<std::string> Add(int32_t id) override {
    if (id < 0 || id >= tokenizer_.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is not in the vocabulary (size ", tokenizer_.vocab_size(), ")"));
    }
    const SentencePieceTokenizer::Piece& piece = tokenizer_.piece(id);
    if (piece.type & TANDEM_SPM_PIECE_BYTE) {
      // Whatever no later byte can change is final already.
      run_.push_back(static_cast<char>(piece.byte));
      const size_t final_bytes = Utf8FinalPrefix(run_);
      std::string out = Utf8LossyPerByte(absl::string_view(run_).substr(0, final_bytes));
      run_.erase(0, final_bytes);
      return Produced(std::move(out));
    }
    std::string out = Utf8LossyPerByte(run_);
    run_.clear();
    produced_ = produced_ || !out.empty();
    if (bos_ws_seen_ || produced_) is_bos_ws_ = false;
    bos_ws_seen_ = false;
    if (piece.type & TANDEM_SPM_PIECE_CONTROL) {
      if (!skip_special_) out += piece.text;  // ours: SentencePiece has no "keep" mode
    } else if (piece.type & TANDEM_SPM_PIECE_UNKNOWN) {
      out += tokenizer_.unknown_surface();
    } else {
      absl::string_view text = piece.text;
      if (is_bos_ws_ && tokenizer_.leading_space() != LeadingSpace::kKeep &&
          absl::ConsumePrefix(&text, kSpace)) {
        // Dropping every leading space (remove_extra_whitespaces) never marks one as seen.
        bos_ws_seen_ = tokenizer_.leading_space() == LeadingSpace::kDropFirst;
      }
      out += absl::StrReplaceAll(text, {{kSpace, " "}});
    }
    return Produced(std::move(out));
  }

  std::string Flush() override {
    std::string out = Utf8LossyPerByte(run_);
    run_.clear();
    return Produced(std::move(out));
  }

 private:
  using LeadingSpace = SentencePieceTokenizer::LeadingSpace;
  std::string Produced(std::string out) {
    produced_ = produced_ || !out.empty();
    return out;
  }

  const SentencePieceTokenizer& tokenizer_;
  const bool skip_special_;
  std::string run_;           // byte pieces not decoded yet
  bool produced_ = false;     // some text has been produced
  bool is_bos_ws_ = true;     // a leading U+2581 would still be dropped
  bool bos_ws_seen_ = false;  // the previous piece had its leading U+2581 dropped
};

}  // namespace

SentencePieceTokenizer::~SentencePieceTokenizer() { lib_->unload(model_); }

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromFile(
    const std::string& path) {
  absl::StatusOr<const SentencePieceLibrary*> lib = SentencePieceLibrary::Default();
  if (!lib.ok()) return lib.status();
  char* error = nullptr;
  tandem_spm_model* model = (*lib)->load(path.c_str(), &error);
  if (model == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", (*lib)->TakeError(error)));
  }
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer(*lib, model));
  if (absl::Status s = t->ReadPieces(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return t;
}

absl::StatusOr<std::string> SentencePieceTokenizer::LibraryDecode(
    const std::vector<int32_t>& ids) const {
  char* text = nullptr;
  char* error = nullptr;
  size_t len = 0;
  if (lib_->decode(model_, ids.data(), ids.size(), &text, &len, &error) != 0) {
    return absl::InternalError(lib_->TakeError(error));
  }
  std::string out(text, len);
  lib_->free(text);
  return out;
}

absl::Status SentencePieceTokenizer::ReadPieces() {
  bos_id_ = lib_->bos_id(model_);
  const int32_t size = lib_->piece_size(model_);
  pieces_.resize(size);
  int32_t space_id = -1, word_id = -1;  // "▁" and some "▁x", for the probe below
  for (int32_t id = 0; id < size; ++id) {
    size_t len = 0;
    const char* text = lib_->id_to_piece(model_, id, &len);
    Piece& p = pieces_[id];
    p.text.assign(text, len);
    p.type = lib_->piece_type(model_, id);
    if (p.type & TANDEM_SPM_PIECE_BYTE) {  // "<0xAB>"
      if (len != 6 || !absl::SimpleHexAtoi(absl::string_view(p.text).substr(3, 2), &p.byte)) {
        return absl::InvalidArgumentError(absl::StrCat("byte piece '", p.text, "' is not <0xXX>"));
      }
    } else if (p.type == 0 && absl::StartsWith(p.text, kSpace)) {
      if (p.text.size() == 3 && space_id < 0) space_id = id;
      if (p.text.size() > 3 && word_id < 0) word_id = id;
    }
    piece_ids_.emplace(p.text, id);
  }
  absl::StatusOr<std::string> unknown = LibraryDecode({lib_->unk_id(model_)});
  if (!unknown.ok()) return unknown.status();
  unknown_surface_ = *unknown;
  return ProbeLeadingSpace(space_id, word_id);
}

// The model's normalizer spec decides how a leading space decodes (add_dummy_prefix /
// remove_extra_whitespaces); the library does not expose it, so ask its decoder.
absl::Status SentencePieceTokenizer::ProbeLeadingSpace(int32_t space_id, int32_t word_id) {
  if (word_id < 0) return absl::OkStatus();  // no piece starts with a space: nothing to drop
  const std::string word = absl::StrReplaceAll(pieces_[word_id].text, {{kSpace, " "}});
  absl::StatusOr<std::string> alone = LibraryDecode({word_id});
  if (!alone.ok()) return alone.status();
  if (*alone == word) {
    leading_space_ = LeadingSpace::kKeep;
  } else if (space_id >= 0) {
    absl::StatusOr<std::string> two = LibraryDecode({space_id, word_id});
    if (!two.ok()) return two.status();
    leading_space_ = *two == word.substr(1) ? LeadingSpace::kDropAll : LeadingSpace::kDropFirst;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text,
                                                                    bool add_special_tokens) const {
  absl::Status valid = ValidateUtf8(text);
  if (!valid.ok()) return valid;
  std::vector<int32_t> ids;
  const size_t prefix = add_special_tokens && bos_id_ >= 0 ? 1 : 0;
  // Rarely more ids than bytes (a normalizer that expands text): then once more, with room.
  size_t capacity = text.size() + 8, count = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    ids.resize(prefix + capacity);
    char* error = nullptr;
    if (lib_->encode(model_, text.data(), text.size(), ids.data() + prefix, capacity, &count,
                     &error) != 0) {
      return absl::InternalError(absl::StrCat("sentencepiece encode: ", lib_->TakeError(error)));
    }
    if (count <= capacity) break;
    capacity = count;
  }
  ids.resize(prefix + count);
  if (prefix == 1) ids[0] = bos_id_;
  return ids;
}

std::unique_ptr<DecodeStream> SentencePieceTokenizer::NewDecodeStream(
    bool skip_special_tokens) const {
  return std::make_unique<SentencePieceStream>(*this, skip_special_tokens);
}

std::optional<int32_t> SentencePieceTokenizer::TokenToId(absl::string_view token) const {
  auto it = piece_ids_.find(token);
  if (it == piece_ids_.end()) return std::nullopt;
  return it->second;
}

bool SentencePieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (pieces_[id].type & TANDEM_SPM_PIECE_CONTROL) != 0;
}

}  // namespace tandem::tokenizer
