#include "tokenizer/bpe.h"

#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// A merge rule as "a b" (older files) or ["a", "b"] (tokenizers >= 0.20).
absl::StatusOr<std::pair<std::string, std::string>> ParseMerge(const nlohmann::json& m) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("BPE merge '", s, "' is not 'a b'"));
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return absl::InvalidArgumentError("BPE merge is neither 'a b' nor [a, b]");
}

}  // namespace

const std::array<uint32_t, 256>& ByteLevelCodePoints() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(const nlohmann::json& model,
                                                           bool byte_level) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  auto option = [&](const char* key) { return model.contains(key) && !model[key].is_null(); };
  if (option("dropout") && model["dropout"].get<double>() != 0.0) {
    return absl::InvalidArgumentError("tokenizer.json: BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (option(key) && !model[key].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: BPE option '", key, "' is not supported"));
    }
  }
  m->byte_fallback_ = option("byte_fallback") && model["byte_fallback"].get<bool>();
  m->ignore_merges_ = option("ignore_merges") && model["ignore_merges"].get<bool>();
  m->fuse_unk_ = option("fuse_unk") && model["fuse_unk"].get<bool>();
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: BPE model without a vocab object");
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    const int32_t i = id.get<int32_t>();
    if (i < 0) return absl::InvalidArgumentError("tokenizer.json: negative token id");
    m->vocab_.emplace(token, i);
    max_id = std::max(max_id, i);
  }
  m->id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : m->vocab_) m->id_to_token_[id] = token;
  if (option("unk_token")) {
    auto it = m->vocab_.find(model["unk_token"].get<std::string>());
    if (it == m->vocab_.end()) {
      return absl::InvalidArgumentError("tokenizer.json: BPE unk_token is not in the vocab");
    }
    m->unk_id_ = it->second;
  }
  const nlohmann::json& merges = model.contains("merges") ? model["merges"] : nlohmann::json();
  int32_t rank = 0;
  for (const nlohmann::json& entry : merges) {
    auto parts = ParseMerge(entry);
    if (!parts.ok()) return parts.status();
    auto a = m->vocab_.find(parts->first), b = m->vocab_.find(parts->second),
         ab = m->vocab_.find(parts->first + parts->second);
    if (a == m->vocab_.end() || b == m->vocab_.end() || ab == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: BPE merge '", parts->first,
                                                     " ", parts->second,
                                                     "' names a token not in the vocab"));
    }
    // A repeated pair keeps its last rank, as Hugging Face's map collection does.
    m->merges_.insert_or_assign(PairKey(a->second, b->second), Merge{rank++, ab->second});
  }
  const std::array<uint32_t, 256>& cps = ByteLevelCodePoints();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(cps[b], &ch);
    auto it = m->vocab_.find(ch);
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
    auto fb = m->vocab_.find(absl::StrFormat("<0x%02X>", b));
    m->fallback_ids_[b] = fb == m->vocab_.end() ? -1 : fb->second;
  }
  return m;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return nullptr;
  return &id_to_token_[id];
}

absl::Status BpeModel::InitialSymbols(absl::string_view word, std::vector<int32_t>* symbols) const {
  auto unknown = [&](absl::string_view what) -> absl::Status {
    if (unk_id_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: '", what, "' is not in the vocabulary and the model has no unk_token"));
    }
    if (!(fuse_unk_ && !symbols->empty() && symbols->back() == unk_id_)) {
      symbols->push_back(unk_id_);
    }
    return absl::OkStatus();
  };
  if (byte_level_) {
    for (unsigned char b : word) {
      if (byte_ids_[b] >= 0) {
        symbols->push_back(byte_ids_[b]);
      } else {
        absl::Status s = unknown(absl::string_view(reinterpret_cast<const char*>(&b), 1));
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    NextCodePoint(word, &pos);
    const absl::string_view ch = word.substr(begin, pos - begin);
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      symbols->push_back(it->second);
    } else if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && fallback_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) symbols->push_back(fallback_ids_[b]);
      } else {
        absl::Status s = unknown(ch);
        if (!s.ok()) return s;
      }
    } else {
      absl::Status s = unknown(ch);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

void BpeModel::ApplyMerges(std::vector<int32_t>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  // Linked list over the symbols + a heap of candidate merges (rank, position), stale entries
  // skipped on pop: O(n log n), as Hugging Face's word merge.
  std::vector<int32_t>& id = *symbols;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merges_.find(PairKey(id[i], id[next[i]]));
    if (it != merges_.end()) heap.push({it->second.rank, i, id[i], id[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int j = next[c.pos];
    if (id[c.pos] != c.left || j < 0 || id[j] != c.right) continue;  // stale
    id[c.pos] = merges_.find(PairKey(c.left, c.right))->second.id;
    id[j] = -1;  // removed
    next[c.pos] = next[j];
    if (next[j] >= 0) prev[next[j]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int out = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) id[out++] = id[i];
  id.resize(out);
}

absl::Status BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return absl::OkStatus();
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> symbols;
  bool whole = false;
  if (ignore_merges_) {
    std::string key;
    if (byte_level_) {
      for (unsigned char b : word) AppendUtf8(ByteLevelCodePoints()[b], &key);
    } else {
      key.assign(word.data(), word.size());
    }
    auto it = vocab_.find(key);
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) {
    absl::Status s = InitialSymbols(word, &symbols);
    if (!s.ok()) return s;
    ApplyMerges(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(symbols));
  }
  return absl::OkStatus();
}

}  // namespace tandem::tokenizer
