#include "tokenizer/pipeline.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string TypeOf(const nlohmann::json& spec) {
  return spec.is_object() && spec.contains("type") && spec["type"].is_string()
             ? spec["type"].get<std::string>()
             : std::string("?");
}

bool Flag(const nlohmann::json& spec, const char* key, bool fallback) {
  return spec.contains(key) && spec[key].is_boolean() ? spec[key].get<bool>() : fallback;
}

std::string EscapeRegex(absl::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (absl::string_view(R"(\^$.|?*+()[]{})").find(c) != absl::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

// A Split/Replace "pattern": {"Regex": "..."} or {"String": "..."} -> a compiled regex.
absl::StatusOr<std::unique_ptr<Regex>> PatternRegex(const nlohmann::json& pattern,
                                                    const char* where) {
  if (pattern.is_object() && pattern.contains("Regex")) {
    return Regex::Compile(pattern["Regex"].get<std::string>());
  }
  if (pattern.is_object() && pattern.contains("String")) {
    return Regex::Compile(EscapeRegex(pattern["String"].get<std::string>()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", where, " pattern is neither Regex nor String"));
}

}  // namespace

absl::StatusOr<MetaspaceOptions> ParseMetaspace(const nlohmann::json& spec) {
  MetaspaceOptions o;
  o.replacement = spec.at("replacement").get<std::string>();
  size_t end = 0;
  if (o.replacement.empty() || (NextCodePoint(o.replacement, &end), end != o.replacement.size())) {
    return absl::InvalidArgumentError("tokenizer.json: Metaspace replacement is not one character");
  }
  const std::string scheme = spec.value("prepend_scheme", std::string("always"));
  if (scheme == "first") {
    o.prepend_scheme = MetaspaceOptions::kFirst;
  } else if (scheme == "never") {
    o.prepend_scheme = MetaspaceOptions::kNever;
  } else if (scheme == "always") {
    o.prepend_scheme = MetaspaceOptions::kAlways;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: Metaspace prepend_scheme '", scheme, "' is not known"));
  }
  if (spec.contains("add_prefix_space") && spec["add_prefix_space"] == false) {
    if (o.prepend_scheme != MetaspaceOptions::kNever) {  // as Hugging Face refuses it
      return absl::InvalidArgumentError(
          "tokenizer.json: Metaspace add_prefix_space does not match prepend_scheme");
    }
  }
  o.split = Flag(spec, "split", true);
  return o;
}

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::Create(const nlohmann::json& spec) {
  auto n = std::make_unique<Normalizer>();
  if (!spec.is_null()) {
    absl::Status s = Parse(spec, &n->steps_);
    if (!s.ok()) return s;
  }
  return n;
}

absl::Status Normalizer::Parse(const nlohmann::json& spec, std::vector<Step>* steps) {
  const std::string type = TypeOf(spec);
  if (type == "Sequence") {
    for (const nlohmann::json& child : spec["normalizers"]) {
      absl::Status s = Parse(child, steps);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "NFC") {
    step.kind = Step::kNfc;
  } else if (type == "NFKC") {
    step.kind = Step::kNfkc;
  } else if (type == "NFD") {
    step.kind = Step::kNfd;
  } else if (type == "NFKD") {
    step.kind = Step::kNfkd;
  } else if (type == "Prepend") {
    step.kind = Step::kPrepend;
    step.a = spec["prepend"].get<std::string>();
  } else if (type == "Replace") {
    step.kind = Step::kReplace;
    step.b = spec["content"].get<std::string>();
    if (spec["pattern"].contains("String")) {
      step.a = spec["pattern"]["String"].get<std::string>();
    } else {
      auto regex = PatternRegex(spec["pattern"], "Replace normalizer");
      if (!regex.ok()) return regex.status();
      step.regex = *std::move(regex);
    }
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: normalizer '", type, "' is not supported"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Normalizer::Apply(std::string text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::kNfc:
      case Step::kNfkc:
      case Step::kNfd:
      case Step::kNfkd: {
        UErrorCode error = U_ZERO_ERROR;
        const icu::Normalizer2* norm =
            step.kind == Step::kNfc    ? icu::Normalizer2::getNFCInstance(error)
            : step.kind == Step::kNfkc ? icu::Normalizer2::getNFKCInstance(error)
            : step.kind == Step::kNfd  ? icu::Normalizer2::getNFDInstance(error)
                                       : icu::Normalizer2::getNFKDInstance(error);
        if (U_FAILURE(error)) return absl::InternalError("ICU normalizer unavailable");
        const icu::UnicodeString in = icu::UnicodeString::fromUTF8(text);
        if (norm->isNormalized(in, error) && U_SUCCESS(error)) break;
        error = U_ZERO_ERROR;
        const icu::UnicodeString out = norm->normalize(in, error);
        if (U_FAILURE(error)) return absl::InternalError("ICU normalization failed");
        text.clear();
        out.toUTF8String(text);
        break;
      }
      case Step::kPrepend:
        if (!text.empty()) text = step.a + text;
        break;
      case Step::kReplace:
        if (step.regex == nullptr) {
          text = absl::StrReplaceAll(text, {{step.a, step.b}});
        } else {
          auto matches = step.regex->FindAll(text);
          if (!matches.ok()) return matches.status();
          std::string out;
          size_t at = 0;
          for (const auto& [b, e] : *matches) {
            out.append(text, at, b - at);
            out.append(step.b);
            at = e;
          }
          out.append(text, at, std::string::npos);
          text = std::move(out);
        }
        break;
    }
  }
  return text;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(const nlohmann::json& spec) {
  auto p = std::make_unique<PreTokenizer>();
  if (!spec.is_null()) {
    absl::Status s = Parse(spec, &p->steps_);
    if (!s.ok()) return s;
  }
  for (const Step& step : p->steps_)
    p->byte_level_ = p->byte_level_ || step.kind == Step::kByteLevel;
  return p;
}

absl::Status PreTokenizer::Parse(const nlohmann::json& spec, std::vector<Step>* steps) {
  const std::string type = TypeOf(spec);
  if (type == "Sequence") {
    for (const nlohmann::json& child : spec["pretokenizers"]) {
      absl::Status s = Parse(child, steps);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "Split") {
    step.kind = Step::kSplit;
    auto regex = PatternRegex(spec["pattern"], "Split pre-tokenizer");
    if (!regex.ok()) return regex.status();
    step.regex = *std::move(regex);
    const std::string behavior = spec.value("behavior", std::string("Isolated"));
    if (behavior == "Removed") {
      step.behavior = Step::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Step::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Step::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Step::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Step::kContiguous;
    } else {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: Split behavior '", behavior, "' is not supported"));
    }
    step.invert = Flag(spec, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Step::kByteLevel;
    step.add_prefix_space = Flag(spec, "add_prefix_space", false);
    if (Flag(spec, "use_regex", true)) {
      auto regex = Regex::Compile(kGpt2Pattern);
      if (!regex.ok()) return regex.status();
      step.regex = *std::move(regex);
    }
  } else if (type == "Metaspace") {
    step.kind = Step::kMetaspace;
    absl::StatusOr<MetaspaceOptions> options = ParseMetaspace(spec);
    if (!options.ok()) return options.status();
    step.metaspace = *std::move(options);
  } else if (type == "Digits") {
    step.kind = Step::kDigits;
    step.individual_digits = Flag(spec, "individual_digits", false);
    auto regex = Regex::Compile(step.individual_digits ? R"(\p{N})" : R"(\p{N}+)");
    if (!regex.ok()) return regex.status();
    step.regex = *std::move(regex);
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: pre-tokenizer '", type, "' is not supported"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

// Hugging Face's Metaspace: spaces -> the replacement, which is prepended to a piece that does
// not start with it ("always"; "first": only to a piece at offset 0 of the input), then (split)
// each replacement starts a new piece (MergedWithNext: a run of them leaves all but the last
// alone).
void PreTokenizer::ApplyMetaspace(const MetaspaceOptions& options, bool at_start,
                                  std::vector<std::string>* pieces) {
  const std::string& rep = options.replacement;
  std::vector<std::string> out;
  for (size_t i = 0; i < pieces->size(); ++i) {
    std::string piece = absl::StrReplaceAll((*pieces)[i], {{" ", rep}});
    const bool prepend = options.prepend_scheme == MetaspaceOptions::kAlways ||
                         (options.prepend_scheme == MetaspaceOptions::kFirst && at_start && i == 0);
    if (prepend && !piece.empty() && piece.compare(0, rep.size(), rep) != 0) piece.insert(0, rep);
    if (!options.split) {
      out.push_back(std::move(piece));
      continue;
    }
    size_t begin = 0;
    const size_t from = piece.compare(0, rep.size(), rep) == 0 ? rep.size() : 0;
    for (size_t at = piece.find(rep, from); at != std::string::npos;
         at = piece.find(rep, at + rep.size())) {
      out.push_back(piece.substr(begin, at - begin));
      begin = at;
    }
    out.push_back(piece.substr(begin));
  }
  *pieces = std::move(out);
}

absl::Status PreTokenizer::ApplyStep(const Step& step, bool at_start,
                                     std::vector<std::string>* pieces) {
  if (step.kind == Step::kMetaspace) {
    ApplyMetaspace(step.metaspace, at_start, pieces);
    return absl::OkStatus();
  }
  std::vector<std::string> out;
  for (std::string& piece : *pieces) {
    if (step.kind == Step::kByteLevel && step.add_prefix_space && !piece.empty() &&
        piece[0] != ' ') {
      piece.insert(piece.begin(), ' ');
    }
    if (step.regex == nullptr) {  // ByteLevel without its regex: the piece stays whole
      out.push_back(std::move(piece));
      continue;
    }
    auto matches = step.regex->FindAll(piece);
    if (!matches.ok()) return matches.status();
    // The piece as (segment, is_match) runs, empty gaps dropped.
    std::vector<std::pair<absl::string_view, bool>> runs;
    const absl::string_view s = piece;
    size_t at = 0;
    for (const auto& [b, e] : *matches) {
      if (b > at) runs.emplace_back(s.substr(at, b - at), false);
      runs.emplace_back(s.substr(b, e - b), true);
      at = e;
    }
    if (at < s.size()) runs.emplace_back(s.substr(at), false);
    const Step::Behavior behavior =
        step.kind == Step::kDigits ? (step.individual_digits ? Step::kIsolated : Step::kContiguous)
                                   : step.behavior;
    const bool invert = step.kind == Step::kSplit && step.invert;
    std::vector<std::string> split;
    bool last_was_match = false;
    for (auto [text, match] : runs) {
      if (invert) match = !match;
      switch (behavior) {
        case Step::kRemoved:
          if (!match) split.emplace_back(text);
          break;
        case Step::kIsolated:
          split.emplace_back(text);
          break;
        case Step::kMergedWithPrevious:
          if (match && !split.empty() && !last_was_match) {
            split.back().append(text.data(), text.size());
          } else {
            split.emplace_back(text);
          }
          break;
        case Step::kMergedWithNext:  // a match joins the run after it unless that is one too
          if (!match && last_was_match && !split.empty()) {
            split.back().append(text.data(), text.size());
          } else {
            split.emplace_back(text);
          }
          break;
        case Step::kContiguous:
          if (match && last_was_match && !split.empty()) {
            split.back().append(text.data(), text.size());
          } else {
            split.emplace_back(text);
          }
          break;
      }
      last_was_match = match;
    }
    for (std::string& p : split) out.push_back(std::move(p));
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

absl::Status PreTokenizer::Split(absl::string_view text, bool at_start,
                                 std::vector<std::string>* out) const {
  std::vector<std::string> pieces = {std::string(text)};
  for (const Step& step : steps_) {
    absl::Status s = ApplyStep(step, at_start, &pieces);
    if (!s.ok()) return s;
  }
  for (std::string& p : pieces) {
    if (!p.empty()) out->push_back(std::move(p));
  }
  return absl::OkStatus();
}

}  // namespace tandem::tokenizer
