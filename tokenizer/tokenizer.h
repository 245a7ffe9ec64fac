// Tokenizer: a Hugging Face tokenizer.json in C++ (no Python in the serving path), verified
// against Hugging Face's `tokenizers` id for id (tokenizer_test, fixtures in testdata/).
//
//   Encode:  text -> added tokens split out (leftmost-longest; lstrip / rstrip / single_word;
//            normalized=false ones on the raw text, normalized=true ones after the normalizer)
//            -> normalizer -> pre-tokenizer -> BPE per word -> post-processor (with
//            add_special_tokens: TemplateProcessing's special tokens, e.g. Llama's BOS).
//   Decode:  ids -> token strings (special ones skipped on request) -> the decoder (decoder.h:
//            ByteLevel, or the SentencePiece-style Replace / ByteFallback / Fuse / Strip /
//            Metaspace chain).
//
// Supported (what GPT-2, Llama-2/3, Mistral, Qwen2/2.5 and DeepSeek files use): model BPE
// (byte-level, or on characters with byte_fallback / unk_token); normalizers NFC/NFKC/NFD/NFKD,
// Prepend, Replace, Sequence; pre-tokenizers Split, ByteLevel, Digits, Metaspace, Sequence;
// post-processors TemplateProcessing, ByteLevel, Sequence; the decoders of decoder.h. Anything
// else fails FromJson with an error naming the component.
//
// Thread safety: const methods may be called concurrently.
#ifndef TANDEM_TOKENIZER_TOKENIZER_H_
#define TANDEM_TOKENIZER_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  // What is matched and decoded: `content`, normalized when `normalized` (as tokenizers >= 0.23
  // does: e.g. a Prepend normalizer makes "foo" match and decode as "\u2581foo").
  std::string text;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer final : public TextTokenizer {
 public:
  // INVALID_ARGUMENT for malformed JSON; UNIMPLEMENTED naming an unsupported component.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);

  // INVALID_ARGUMENT for text that is not valid UTF-8 (naming the byte offset).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  std::unique_ptr<DecodeStream> NewDecodeStream(bool skip_special_tokens) const override;

  // Ids 0 .. vocab_size() - 1 (model vocabulary and added tokens).
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override;

 private:
  Tokenizer() = default;
  absl::Status ParseAddedTokens(const nlohmann::json& list);
  absl::Status ParsePostProcessor(const nlohmann::json& spec);
  // Splits `text` on the added tokens with normalized == `normalized`: appends (text, -1) runs
  // and (content, id) matches to `out`.
  void SplitAdded(absl::string_view text, bool normalized,
                  std::vector<std::pair<std::string, int32_t>>* out) const;
  // `at_start`: `text` begins at offset 0 of the input.
  absl::Status EncodeSegment(absl::string_view text, bool at_start,
                             std::vector<int32_t>* ids) const;
  // What the decoder is given for `id`: its string, or nullptr when it is skipped (a special
  // token's string, as Hugging Face compares them, with skip_special_tokens).
  absl::StatusOr<const std::string*> DecoderToken(int32_t id, bool skip_special_tokens) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  absl::flat_hash_set<std::string> special_contents_;
  // [normalized][first byte] -> indices into added_, longest content first.
  std::array<std::vector<size_t>, 256> by_first_byte_[2];
  // Post-processor (single sequence): ids before and after the text with add_special_tokens.
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int32_t vocab_size_ = 0;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_TOKENIZER_H_
