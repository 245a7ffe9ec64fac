// SentencePieceTokenizer: a SentencePiece `.model` (Llama-2, Mistral v1/v3 tokenizer.model)
// through Debian's libsentencepiece — the kept library, not a rewrite — reached through
// libtandem_spm.so in its own link namespace (sentencepiece_library.h), so any process can use
// it, gRPC ones included. Encode runs in the library and adds the model's BOS with
// add_special_tokens (as Hugging Face's Llama/Mistral tokenizers do). Decoding is ours, on the
// piece table copied at load, and follows SentencePiece's Decode exactly, token by token:
// U+2581 -> space; a run of <0xXX> byte pieces decodes as a whole (each byte that does not
// begin a valid character -> U+FFFD); the unknown piece -> the model's unknown surface
// (" \u2047 "); the first leading U+2581 of the text is dropped once; control pieces (<s>, </s>)
// are invisible (SentencePiece has no "keep special tokens" mode: with
// skip_special_tokens=false they render as their piece text).
//
// Thread safety: const methods may be called concurrently.
#ifndef TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tokenizer/sentencepiece_library.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::tokenizer {

class SentencePieceTokenizer final : public TextTokenizer {
 public:
  // The library's error (see SentencePieceLibrary::Default) when libtandem_spm.so cannot be
  // loaded; INVALID_ARGUMENT with SentencePiece's message for a missing or bad model file.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromFile(const std::string& path);
  ~SentencePieceTokenizer() override;

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  std::unique_ptr<DecodeStream> NewDecodeStream(bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override;

  // The piece table, as the decoder reads it.
  struct Piece {
    std::string text;
    uint32_t type = 0;  // TANDEM_SPM_PIECE_* bits
    int byte = -1;      // TANDEM_SPM_PIECE_BYTE: the byte value
  };
  const Piece& piece(int32_t id) const { return pieces_[id]; }
  const std::string& unknown_surface() const { return unknown_surface_; }
  // What the decoder does with a leading U+2581 (the model's add_dummy_prefix and
  // remove_extra_whitespaces): keep it, drop the first one, or drop them all until some text.
  enum class LeadingSpace { kKeep, kDropFirst, kDropAll };
  LeadingSpace leading_space() const { return leading_space_; }

 private:
  SentencePieceTokenizer(const SentencePieceLibrary* lib, tandem_spm_model* model)
      : lib_(lib), model_(model) {}
  absl::Status ReadPieces();
  absl::Status ProbeLeadingSpace(int32_t space_id, int32_t word_id);
  // SentencePiece's own decoding (in the library).
  absl::StatusOr<std::string> LibraryDecode(const std::vector<int32_t>& ids) const;

  const SentencePieceLibrary* lib_;
  tandem_spm_model* model_;  // owned; lives in the library's namespace
  int32_t bos_id_ = -1;
  std::vector<Piece> pieces_;
  absl::flat_hash_map<std::string, int32_t> piece_ids_;
  std::string unknown_surface_;
  LeadingSpace leading_space_ = LeadingSpace::kDropFirst;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
