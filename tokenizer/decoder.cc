#include "tokenizer/decoder.h"

#include <array>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

std::string TypeOf(const nlohmann::json& spec) {
  return spec.is_object() && spec.contains("type") && spec["type"].is_string()
             ? spec["type"].get<std::string>()
             : std::string("?");
}

absl::Status Unsupported(const std::string& what) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: decoder ", what,
                                               " is not supported (ByteLevel, or Replace / "
                                               "Metaspace / Strip, ByteFallback, Fuse, Strip)"));
}

// ByteFallback's test (Hugging Face): exactly "<0x" + two characters + ">", the two parsed as a
// u8 in base 16 by Rust (hex digits, or '+' and one digit).
bool ByteToken(const std::string& token, char* byte) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return false;
  auto digit = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  const int hi = digit(token[3]), lo = digit(token[4]);
  if (token[3] == '+' && lo >= 0) {
    *byte = static_cast<char>(lo);
    return true;
  }
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<char>(hi * 16 + lo);
  return true;
}

// GPT-2's byte alphabet back to bytes; a token with a character outside it gives its own UTF-8.
void AppendByteLevelBytes(const std::string& token, std::string* out) {
  // Code point -> byte + 1 (0: not in the alphabet); the alphabet is U+0021 .. U+0143.
  static const auto* byte_of = [] {
    auto* table = new std::array<uint16_t, 0x144>();
    const auto& cps = ByteLevelCodePoints();
    for (int b = 0; b < 256; ++b) (*table)[cps[b]] = static_cast<uint16_t>(b + 1);
    return table;
  }();
  const size_t start = out->size();
  for (size_t pos = 0; pos < token.size();) {
    const uint32_t cp = NextCodePoint(token, &pos);
    const uint16_t b = cp < byte_of->size() ? (*byte_of)[cp] : 0;
    if (b == 0) {
      out->resize(start);
      out->append(token);
      return;
    }
    out->push_back(static_cast<char>(b - 1));
  }
}

class ByteLevelStream final : public DecodeStream {
 public:
  explicit ByteLevelStream(Decoder::TokenSource token_of) : token_of_(std::move(token_of)) {}
  absl::StatusOr<std::string> Add(int32_t id) override {
    return AddAll(absl::Span<const int32_t>(&id, 1));
  }
  // The bytes of every token, then what of them is final: as many Adds (the final prefix of a
  // longer text extends that of a shorter one).
  absl::StatusOr<std::string> AddAll(absl::Span<const int32_t> ids) override {
    for (int32_t id : ids) {
      absl::StatusOr<const std::string*> token = token_of_(id);
      if (!token.ok()) return token.status();
      if (*token != nullptr) AppendByteLevelBytes(**token, &pending_);
    }
    const size_t final_bytes = Utf8FinalPrefix(pending_);
    std::string out = Utf8Lossy(absl::string_view(pending_).substr(0, final_bytes));
    pending_.erase(0, final_bytes);
    return out;
  }
  std::string Flush() override {
    std::string out = Utf8Lossy(pending_);
    pending_.clear();
    return out;
  }

 private:
  Decoder::TokenSource token_of_;
  std::string pending_;  // an incomplete character's bytes
};

}  // namespace

// The SentencePiece-style chain, token by token (see decoder.h).
class ChainStream final : public DecodeStream {
 public:
  ChainStream(const Decoder& decoder, Decoder::TokenSource token_of)
      : decoder_(decoder),
        token_of_(std::move(token_of)),
        strip_left_(decoder.strip_whole_count_) {}

  absl::StatusOr<std::string> Add(int32_t id) override {
    absl::StatusOr<const std::string*> token = token_of_(id);
    if (!token.ok()) return token.status();
    if (*token == nullptr) return std::string();  // left out before the decoder: no run ends
    absl::StatusOr<std::string> text = decoder_.PerToken(**token, /*first=*/!kept_);
    if (!text.ok()) return text.status();
    kept_ = true;
    char byte = 0;
    if (decoder_.byte_fallback_ && ByteToken(*text, &byte)) {
      run_.push_back(byte);  // valid or not is known only when the run ends
      return std::string();
    }
    return StripLeading(EndRun() + *text);
  }
  std::string Flush() override { return StripLeading(EndRun()); }

 private:
  std::string EndRun() {
    std::string out;
    if (ValidateUtf8(run_).ok()) {
      out = std::move(run_);
    } else {
      for (size_t i = 0; i < run_.size(); ++i) out += kFffd;
    }
    run_.clear();
    return out;
  }
  // Strip after Fuse: up to strip_left_ leading characters of the whole text.
  std::string StripLeading(std::string out) {
    const std::string& c = decoder_.strip_whole_;
    size_t cut = 0;
    while (strip_left_ > 0 && cut < out.size()) {
      if (out.compare(cut, c.size(), c) != 0) {
        strip_left_ = 0;
        break;
      }
      cut += c.size();
      --strip_left_;
    }
    out.erase(0, cut);
    return out;
  }

  const Decoder& decoder_;
  Decoder::TokenSource token_of_;
  bool kept_ = false;
  std::string run_;  // the current ByteFallback run's bytes
  int strip_left_;
};

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const nlohmann::json& spec) {
  if (spec.is_null()) {
    return absl::UnimplementedError(
        "tokenizer.json: no decoder (Hugging Face joins the tokens with spaces) is not supported");
  }
  std::unique_ptr<Decoder> d(new Decoder());
  int phase = 0;  // 0: per-token steps, 1: after ByteFallback, 2: after Fuse, 3: after ByteLevel
  absl::Status s = d->Parse(spec, &phase);
  if (!s.ok()) return s;
  return d;
}

absl::Status Decoder::Parse(const nlohmann::json& spec, int* phase) {
  const std::string type = TypeOf(spec);
  if (type == "Sequence") {
    for (const nlohmann::json& child : spec.at("decoders")) {
      absl::Status s = Parse(child, phase);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (*phase == 3) return Unsupported(absl::StrCat("'", type, "' after ByteLevel"));
  if (type == "ByteLevel") {
    if (*phase != 0 || !per_token_.empty()) return Unsupported("ByteLevel after other steps");
    byte_level_ = true;
    *phase = 3;
    return absl::OkStatus();
  }
  if (type == "ByteFallback" && *phase == 0) {
    byte_fallback_ = true;
    *phase = 1;
    return absl::OkStatus();
  }
  if (type == "Fuse") {
    *phase = 2;
    return absl::OkStatus();
  }
  if (type == "Strip" && *phase == 2) {
    if (spec.value("stop", 0) != 0 || !strip_whole_.empty()) {
      return Unsupported("Strip of the end of the text, or twice, after Fuse");
    }
    strip_whole_ = spec.at("content").get<std::string>();
    strip_whole_count_ = spec.value("start", 0);
    return absl::OkStatus();
  }
  if ((type == "Replace" || type == "Metaspace" || type == "Strip") && *phase == 0) {
    absl::StatusOr<Step> step = ParseStep(spec, type);
    if (!step.ok()) return step.status();
    per_token_.push_back(*std::move(step));
    return absl::OkStatus();
  }
  return Unsupported(
      *phase == 0 ? absl::StrCat("'", type, "'")
                  : absl::StrCat("'", type, "' after ", *phase == 1 ? "ByteFallback" : "Fuse"));
}

absl::StatusOr<Decoder::Step> Decoder::ParseStep(const nlohmann::json& spec,
                                                 const std::string& type) {
  Step step;
  if (type == "Replace") {
    step.kind = Step::kReplace;
    step.to = spec.at("content").get<std::string>();
    const nlohmann::json& pattern = spec.at("pattern");
    if (pattern.contains("String")) {
      step.from = pattern["String"].get<std::string>();
      if (step.from.empty()) return Unsupported("Replace of an empty string");
    } else if (pattern.contains("Regex")) {
      auto regex = Regex::Compile(pattern["Regex"].get<std::string>());
      if (!regex.ok()) return regex.status();
      step.regex = *std::move(regex);
    } else {
      return absl::InvalidArgumentError(
          "tokenizer.json: Replace pattern is neither Regex nor String");
    }
  } else if (type == "Metaspace") {
    absl::StatusOr<MetaspaceOptions> options = ParseMetaspace(spec);
    if (!options.ok()) return options.status();
    step.kind = Step::kMetaspace;
    step.from = options->replacement;
    step.drop_first = options->prepend_scheme != MetaspaceOptions::kNever;
  } else {  // Strip
    step.kind = Step::kStrip;
    step.strip = spec.at("content").get<std::string>();
    step.start = spec.value("start", 0);
    step.stop = spec.value("stop", 0);
  }
  return step;
}

absl::StatusOr<std::string> Decoder::PerToken(const std::string& token, bool first) const {
  std::string text = token;
  for (const Step& step : per_token_) {
    switch (step.kind) {
      case Step::kReplace:
        if (step.regex == nullptr) {
          text = absl::StrReplaceAll(text, {{step.from, step.to}});
        } else {
          auto matches = step.regex->FindAll(text);
          if (!matches.ok()) return matches.status();
          std::string out;
          size_t at = 0;
          for (const auto& [b, e] : *matches) {
            out.append(text, at, b - at).append(step.to);
            at = e;
          }
          text = out.append(text, at, std::string::npos);
        }
        break;
      case Step::kMetaspace:
        text = absl::StrReplaceAll(text, {{step.from, first && step.drop_first ? "" : " "}});
        break;
      case Step::kStrip: {
        // Up to `start` leading and `stop` trailing copies of the character (never overlapping).
        size_t b = 0, e = text.size();
        for (int i = 0; i < step.start && absl::StartsWith(text.substr(b, e - b), step.strip); ++i)
          b += step.strip.size();
        for (int i = 0; i < step.stop && absl::EndsWith(text.substr(b, e - b), step.strip); ++i)
          e -= step.strip.size();
        text = text.substr(b, e - b);
        break;
      }
    }
  }
  return text;
}

std::unique_ptr<DecodeStream> Decoder::NewStream(TokenSource token_of) const {
  if (byte_level_) return std::make_unique<ByteLevelStream>(std::move(token_of));
  return std::make_unique<ChainStream>(*this, std::move(token_of));
}

}  // namespace tandem::tokenizer
