#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

std::string TypeOf(const nlohmann::json& spec) {
  return spec.is_object() && spec.contains("type") && spec["type"].is_string()
             ? spec["type"].get<std::string>()
             : std::string("?");
}

bool IsSpace(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool IsWordByte(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// The code point ending right before byte offset `end` of valid UTF-8, and where it starts.
uint32_t PrevCodePoint(absl::string_view text, size_t end, size_t* begin) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
  *begin = b;
  size_t pos = b;
  return NextCodePoint(text, &pos);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto t = FromJson(buffer.str());
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view json) {
  nlohmann::json doc =
      nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    const nlohmann::json& model = doc["model"];
    if (TypeOf(model) != "BPE") {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: model '", TypeOf(model), "' is not supported (BPE is)"));
    }
    auto normalizer = Normalizer::Create(doc.value("normalizer", nlohmann::json()));
    if (!normalizer.ok()) return normalizer.status();
    t->normalizer_ = *std::move(normalizer);
    auto pre = PreTokenizer::Create(doc.value("pre_tokenizer", nlohmann::json()));
    if (!pre.ok()) return pre.status();
    t->pre_tokenizer_ = *std::move(pre);
    auto decoder = Decoder::Create(doc.value("decoder", nlohmann::json()));
    if (!decoder.ok()) return decoder.status();
    t->decoder_ = *std::move(decoder);
    auto bpe = BpeModel::Create(model, t->pre_tokenizer_->byte_level());
    if (!bpe.ok()) return bpe.status();
    t->model_ = *std::move(bpe);
    t->vocab_size_ = t->model_->max_id() + 1;
    absl::Status s = t->ParseAddedTokens(doc.value("added_tokens", nlohmann::json::array()));
    if (!s.ok()) return s;
    s = t->ParsePostProcessor(doc.value("post_processor", nlohmann::json()));
    if (!s.ok()) return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  return t;
}

absl::Status Tokenizer::ParseAddedTokens(const nlohmann::json& list) {
  for (const nlohmann::json& entry : list) {
    AddedToken a;
    a.id = entry.at("id").get<int32_t>();
    a.content = entry.at("content").get<std::string>();
    a.special = entry.value("special", false);
    a.lstrip = entry.value("lstrip", false);
    a.rstrip = entry.value("rstrip", false);
    a.single_word = entry.value("single_word", false);
    a.normalized = entry.value("normalized", !a.special);
    if (a.id < 0 || a.content.empty()) {
      return absl::InvalidArgumentError("tokenizer.json: an added token without id or content");
    }
    a.text = a.content;
    if (a.normalized) {
      absl::StatusOr<std::string> text = normalizer_->Apply(a.content);
      if (!text.ok()) return text.status();
      if (!text->empty()) a.text = *std::move(text);
    }
    vocab_size_ = std::max(vocab_size_, a.id + 1);
    added_by_id_[a.id] = added_.size();
    added_by_content_[a.content] = a.id;
    if (a.special) special_contents_.insert(a.content);
    added_.push_back(std::move(a));
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& a = added_[i];
    by_first_byte_[a.normalized][static_cast<uint8_t>(a.text[0])].push_back(i);
  }
  for (auto& table : by_first_byte_) {
    for (std::vector<size_t>& list : table) {
      std::stable_sort(list.begin(), list.end(), [this](size_t x, size_t y) {
        return added_[x].text.size() > added_[y].text.size();
      });
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::ParsePostProcessor(const nlohmann::json& spec) {
  const std::string type = TypeOf(spec);
  if (spec.is_null() || type == "ByteLevel") return absl::OkStatus();  // ids unchanged
  if (type == "Sequence") {
    for (const nlohmann::json& child : spec["processors"]) {
      absl::Status s = ParsePostProcessor(child);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: post-processor '", type, "' is not supported"));
  }
  bool seen_sequence = false;
  for (const nlohmann::json& piece : spec["single"]) {
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", "A") != "A") {
        return absl::UnimplementedError("TemplateProcessing: single template names sequence B");
      }
      seen_sequence = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    const nlohmann::json& special = spec.at("special_tokens").at(name);
    for (const nlohmann::json& id : special.at("ids")) {
      (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(id.get<int32_t>());
    }
  }
  return absl::OkStatus();
}

void Tokenizer::SplitAdded(absl::string_view text, bool normalized,
                           std::vector<std::pair<std::string, int32_t>>* out) const {
  size_t run_begin = 0, pos = 0;
  while (pos < text.size()) {
    // Leftmost-longest: the longest added token starting here (candidates by first byte,
    // longest first).
    const AddedToken* best = nullptr;
    for (size_t index : by_first_byte_[normalized][static_cast<uint8_t>(text[pos])]) {
      const AddedToken& a = added_[index];
      if (a.text.size() > text.size() - pos) continue;
      if (text.compare(pos, a.text.size(), a.text) != 0) continue;
      if (a.single_word) {
        const size_t end = pos + a.text.size();
        if ((pos > 0 && IsWordByte(text[pos - 1])) || (end < text.size() && IsWordByte(text[end])))
          continue;
      }
      best = &a;
      break;
    }
    if (best == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + best->text.size();
    if (best->lstrip) {
      while (begin > run_begin) {
        size_t prev = 0;
        if (!IsSpace(PrevCodePoint(text, begin, &prev))) break;
        begin = prev;
      }
    }
    if (best->rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!IsSpace(NextCodePoint(text, &next))) break;
        end = next;
      }
    }
    if (begin > run_begin)
      out->emplace_back(std::string(text.substr(run_begin, begin - run_begin)), -1);
    out->emplace_back(best->content, best->id);
    pos = run_begin = end;
  }
  if (run_begin < text.size()) out->emplace_back(std::string(text.substr(run_begin)), -1);
}

absl::Status Tokenizer::EncodeSegment(absl::string_view text, bool at_start,
                                      std::vector<int32_t>* ids) const {
  auto normalized = normalizer_->Apply(std::string(text));
  if (!normalized.ok()) return normalized.status();
  std::vector<std::pair<std::string, int32_t>> parts;
  SplitAdded(*normalized, /*normalized=*/true, &parts);
  std::vector<std::string> words;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& [part, id] = parts[i];
    if (id >= 0) {
      ids->push_back(id);
      continue;
    }
    words.clear();
    absl::Status s = pre_tokenizer_->Split(part, at_start && i == 0, &words);
    if (!s.ok()) return s;
    for (const std::string& w : words) {
      s = model_->Tokenize(w, ids);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  absl::Status valid = ValidateUtf8(text);
  if (!valid.ok()) return valid;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  std::vector<std::pair<std::string, int32_t>> parts;
  SplitAdded(text, /*normalized=*/false, &parts);
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& [part, id] = parts[i];
    if (id >= 0) {
      ids.push_back(id);
    } else {
      absl::Status s = EncodeSegment(part, /*at_start=*/i == 0, &ids);
      if (!s.ok()) return s;
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::StatusOr<const std::string*> Tokenizer::DecoderToken(int32_t id,
                                                           bool skip_special_tokens) const {
  const std::string* token = nullptr;
  auto added = added_by_id_.find(id);
  if (added != added_by_id_.end()) {
    token = &added_[added->second].text;
  } else {
    token = model_->IdToToken(id);
    if (token != nullptr && token->empty()) token = nullptr;  // a gap in the ids
  }
  if (token == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
  }
  if (skip_special_tokens && special_contents_.contains(*token)) return nullptr;
  return token;
}

std::unique_ptr<DecodeStream> Tokenizer::NewDecodeStream(bool skip_special_tokens) const {
  return decoder_->NewStream(
      [this, skip_special_tokens](int32_t id) { return DecoderToken(id, skip_special_tokens); });
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  auto added = added_by_content_.find(token);
  if (added != added_by_content_.end()) return added->second;
  auto it = model_->vocab().find(token);
  if (it != model_->vocab().end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace tandem::tokenizer
