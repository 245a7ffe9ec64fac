// The text pipeline of a tokenizer.json before the model: the normalizer (NFC/NFKC/NFD/NFKD via
// ICU, Prepend, Replace, Sequence) and the pre-tokenizer (Split with a regex or string and its
// five behaviours, ByteLevel with or without the GPT-2 regex, Digits, Metaspace, Sequence) that
// cut a text into the words BPE tokenizes. Components outside this set fail Create with an error
// naming them: never a silently different tokenization.
//
// Thread safety: immutable after Create.
#ifndef TANDEM_TOKENIZER_PIPELINE_H_
#define TANDEM_TOKENIZER_PIPELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/regex.h"

namespace tandem::tokenizer {

// A Metaspace pre-tokenizer's / decoder's options, read as Hugging Face reads them
// (prepend_scheme defaults to "always"; the older add_prefix_space=false means "never").
struct MetaspaceOptions {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  enum PrependScheme { kFirst, kNever, kAlways } prepend_scheme = kAlways;
  bool split = true;
};
absl::StatusOr<MetaspaceOptions> ParseMetaspace(const nlohmann::json& spec);

class Normalizer {
 public:
  // `spec`: tokenizer.json's "normalizer" (null: identity).
  static absl::StatusOr<std::unique_ptr<Normalizer>> Create(const nlohmann::json& spec);
  // Valid UTF-8 in and out.
  absl::StatusOr<std::string> Apply(std::string text) const;
  bool identity() const { return steps_.empty(); }

 private:
  struct Step {
    enum Kind { kNfc, kNfkc, kNfd, kNfkd, kPrepend, kReplace } kind;
    std::string a, b;              // Prepend: a; Replace: a -> b (a literal) or regex -> b
    std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
  };
  static absl::Status Parse(const nlohmann::json& spec, std::vector<Step>* steps);
  std::vector<Step> steps_;
};

class PreTokenizer {
 public:
  // `spec`: tokenizer.json's "pre_tokenizer" (null: the whole text is one word).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(const nlohmann::json& spec);
  // Appends the words of `text` (raw UTF-8 slices: byte-level mapping is the model's) to `out`.
  // `at_start`: `text` begins at offset 0 of the encoded input (Metaspace's prepend_scheme
  // "first" adds its space only there, not after an added token).
  absl::Status Split(absl::string_view text, bool at_start, std::vector<std::string>* out) const;
  // A ByteLevel step is present: words are to be tokenized byte by byte.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    enum Kind { kSplit, kByteLevel, kDigits, kMetaspace } kind;
    std::unique_ptr<Regex> regex;  // kSplit (a string pattern is escaped), ByteLevel's GPT-2
    enum Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
    Behavior behavior = kIsolated;
    bool invert = false;
    bool add_prefix_space = false;   // ByteLevel
    bool individual_digits = false;  // Digits
    MetaspaceOptions metaspace;      // Metaspace
  };
  static absl::Status Parse(const nlohmann::json& spec, std::vector<Step>* steps);
  static absl::Status ApplyStep(const Step& step, bool at_start, std::vector<std::string>* pieces);
  static void ApplyMetaspace(const MetaspaceOptions& options, bool at_start,
                             std::vector<std::string>* pieces);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_PIPELINE_H_
