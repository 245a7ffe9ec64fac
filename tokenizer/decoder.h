// Decoder: the "decoder" of a tokenizer.json as a DecodeStream over the tokens' strings,
// matching Hugging Face's `decode` (tokens -> decoder chain -> joined) output for output. Two
// shapes are supported:
//
//   ByteLevel (GPT-2, Llama-3, Qwen, DeepSeek): every token's characters back to bytes (a token
//     with a character outside the byte alphabet, an added token, gives its own UTF-8), the
//     whole decoded lossily (from_utf8_lossy).
//   The SentencePiece-style chain (Llama-2, Mistral, Gemma: e.g. Replace(U+2581 -> " "),
//     ByteFallback, Fuse, Strip(" ", 1, 0)): per-token steps first — Replace, Metaspace (U+2581
//     -> space; the first token loses all of them unless prepend_scheme is "never"), Strip —
//     then ByteFallback (a run of consecutive <0xXX> tokens decodes as a whole: its bytes when
//     they are valid UTF-8, else one U+FFFD per byte, so a run is held until it ends), then
//     Fuse, then Strip on the whole text (leading characters only).
//
// Anything else (other decoders; steps after ByteFallback other than Fuse; after Fuse other
// than a leading Strip; no decoder at all) fails Create naming it: never a silently different
// text.
//
// Thread safety: immutable after Create; each stream is one decoding's.
#ifndef TANDEM_TOKENIZER_DECODER_H_
#define TANDEM_TOKENIZER_DECODER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/regex.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::tokenizer {

class Decoder {
 public:
  // `spec`: tokenizer.json's "decoder". UNIMPLEMENTED naming what is not supported.
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(const nlohmann::json& spec);

  // The string the decoder is given for token `id` (added token content or vocabulary entry),
  // nullptr for a token left out (a special one, skipped), or INVALID_ARGUMENT for a bad id.
  using TokenSource = std::function<absl::StatusOr<const std::string*>(int32_t id)>;
  // A stream reading tokens from `token_of` (which must outlive it).
  std::unique_ptr<DecodeStream> NewStream(TokenSource token_of) const;

  bool byte_level() const { return byte_level_; }

 private:
  friend class ChainStream;
  struct Step {
    enum Kind { kReplace, kMetaspace, kStrip } kind;
    std::string from, to;          // Replace (literal from, or regex); Metaspace: replacement
    std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
    bool drop_first = false;       // Metaspace: prepend_scheme is not "never"
    std::string strip;             // Strip: the character
    int start = 0, stop = 0;       // Strip: how many at each end
  };
  static absl::StatusOr<Step> ParseStep(const nlohmann::json& spec, const std::string& type);
  absl::Status Parse(const nlohmann::json& spec, int* phase);
  // The per-token steps on one token; `first`: no token before it was kept.
  absl::StatusOr<std::string> PerToken(const std::string& token, bool first) const;

  bool byte_level_ = false;
  std::vector<Step> per_token_;
  bool byte_fallback_ = false;
  std::string strip_whole_;  // Strip after Fuse: the character, up to strip_whole_count_ times
  int strip_whole_count_ = 0;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_DECODER_H_
