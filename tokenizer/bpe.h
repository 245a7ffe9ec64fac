// BpeModel: the "BPE" model of a Hugging Face tokenizer.json — vocabulary, ranked merges, and the
// options real files use (byte_fallback, ignore_merges, unk_token, fuse_unk). Works on token ids:
// a word's initial symbols are ids (one per byte for byte-level pre-tokenization; one per
// character otherwise, with <0xXX> byte tokens as the fallback), and the lowest-ranked adjacent
// pair is merged until none applies, leftmost first among equal ranks, as Hugging Face does.
//
// Thread safety: immutable after Create except the word cache, which has its own mutex.
#ifndef TANDEM_TOKENIZER_BPE_H_
#define TANDEM_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// Byte-level (GPT-2) alphabet: byte b <-> the printable code point that stands for it.
const std::array<uint32_t, 256>& ByteLevelCodePoints();

class BpeModel {
 public:
  // `model`: tokenizer.json's "model" object with "type": "BPE". `byte_level`: the
  // pre-tokenizer maps bytes to the GPT-2 alphabet (words arrive as raw bytes). INVALID_ARGUMENT
  // naming the option for what is not supported (dropout, continuing_subword_prefix,
  // end_of_word_suffix) or a merge whose parts or result are not in the vocabulary.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const nlohmann::json& model,
                                                          bool byte_level);

  // Appends the ids of one pre-tokenized word (raw UTF-8 bytes) to `out`.
  absl::Status Tokenize(absl::string_view word, std::vector<int32_t>* out) const;

  // The token string of `id` (as in the vocabulary), or nullptr.
  const std::string* IdToToken(int32_t id) const;
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  BpeModel() = default;
  absl::Status InitialSymbols(absl::string_view word, std::vector<int32_t>* symbols) const;
  void ApplyMerges(std::vector<int32_t>* symbols) const;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_ids_{};          // byte-level: byte -> id (-1: none)
  std::array<int32_t, 256> fallback_ids_{};      // byte_fallback: byte -> <0xXX> id (-1: none)

  static constexpr size_t kCacheCapacity = 20000;
  static constexpr size_t kMaxCachedWordBytes = 64;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_BPE_H_
