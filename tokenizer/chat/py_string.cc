#include "tokenizer/chat/py_string.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "tokenizer/utf8.h"
#include "unicode/locid.h"
#include "unicode/uchar.h"
#include "unicode/unistr.h"

namespace tandem::tokenizer::chat {
namespace {

// Decodes the code point at s[*pos] and advances; an invalid byte decodes as itself.
uint32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  int len = 1;
  uint32_t cp = b0;
  if (b0 >= 0xF0 && b0 < 0xF8) {
    len = 4;
    cp = b0 & 0x07;
  } else if (b0 >= 0xE0) {
    len = b0 < 0xF0 ? 3 : 1;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  }
  if (len == 1 || *pos + len > s.size()) {
    ++*pos;
    return b0;
  }
  for (int i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[*pos + i]);
    if ((b & 0xC0) != 0x80) {
      ++*pos;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *pos += len;
  return cp;
}

std::vector<uint32_t> Decode(absl::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) cps.push_back(NextCodePoint(s, &pos));
  return cps;
}

std::string IcuMap(absl::string_view s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), s.size()));
  if (upper) {
    u.toUpper(icu::Locale::getRoot());
  } else {
    u.toLower(icu::Locale::getRoot());
  }
  std::string out;
  u.toUTF8String(out);
  return out;
}

bool IsCased(uint32_t cp) {
  const int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER;
}

bool IsPrintable(uint32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::vector<size_t> CodePointOffsets(absl::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t pos = 0; pos < s.size();) {
    offsets.push_back(pos);
    NextCodePoint(s, &pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t CodePointLength(absl::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) NextCodePoint(s, &pos);
  return n;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::vector<uint32_t> strip_set = chars ? Decode(*chars) : std::vector<uint32_t>{};
  auto strip = [&](uint32_t cp) {
    if (!chars) return IsPySpace(cp);
    for (uint32_t c : strip_set) {
      if (c == cp) return true;
    }
    return false;
  };
  const std::vector<size_t> offsets = CodePointOffsets(s);
  size_t begin = 0, end = offsets.size() - 1;  // In code points.
  auto cp_at = [&](size_t i) {
    size_t pos = offsets[i];
    return NextCodePoint(s, &pos);
  };
  if (left) {
    while (begin < end && strip(cp_at(begin))) ++begin;
  }
  if (right) {
    while (end > begin && strip(cp_at(end - 1))) --end;
  }
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t hit = s.find(*sep, start);
        if (hit == absl::string_view::npos) break;
        parts.emplace_back(s.substr(start, hit - start));
        start = hit + sep->size();
      }
      parts.emplace_back(s.substr(start));
      return parts;
    }
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.substr(0, end).rfind(*sep);
      if (hit == absl::string_view::npos) break;
      rev.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    rev.emplace_back(s.substr(0, end));
    return std::vector<std::string>(rev.rbegin(), rev.rend());
  }
  // Whitespace runs; from_right only matters with maxsplit.
  const std::vector<size_t> offsets = CodePointOffsets(s);
  std::vector<std::pair<size_t, size_t>> words;  // Byte ranges.
  size_t i = 0;
  const size_t n = offsets.size() - 1;
  auto space_at = [&](size_t k) {
    size_t pos = offsets[k];
    return IsPySpace(NextCodePoint(s, &pos));
  };
  while (i < n) {
    while (i < n && space_at(i)) ++i;
    if (i == n) break;
    size_t j = i;
    while (j < n && !space_at(j)) ++j;
    words.emplace_back(offsets[i], offsets[j]);
    i = j;
  }
  if (maxsplit < 0 || static_cast<int64_t>(words.size()) <= maxsplit) {
    for (const auto& [b, e] : words) parts.emplace_back(s.substr(b, e - b));
    return parts;
  }
  if (!from_right) {
    for (int64_t k = 0; k < maxsplit; ++k) {
      parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    parts.emplace_back(s.substr(words[maxsplit].first));  // Keeps its trailing whitespace.
    return parts;
  }
  const size_t first = words.size() - maxsplit;
  parts.emplace_back(s.substr(0, words[first - 1].second));  // Keeps its leading whitespace.
  for (size_t k = first; k < words.size(); ++k) {
    parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
  }
  return parts;
}

std::vector<std::string> PySplitLines(absl::string_view s) {
  std::vector<std::string> lines;
  std::string current;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                          cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      current.append(s.data() + start, pos - start);
      continue;
    }
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    lines.push_back(std::move(current));
    current.clear();
  }
  if (!current.empty()) lines.push_back(std::move(current));
  return lines;
}

std::string PyReplace(absl::string_view s, absl::string_view old_text, absl::string_view new_text,
                      int64_t count) {
  std::string out;
  if (old_text.empty()) {
    const std::vector<size_t> offsets = CodePointOffsets(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < offsets.size() || i == 0; ++i) {
      if (count < 0 || done < count) {
        out.append(new_text.data(), new_text.size());
        ++done;
      }
      if (i + 1 >= offsets.size()) break;
      out.append(s.data() + offsets[i], offsets[i + 1] - offsets[i]);
    }
    if (!s.empty() && (count < 0 || done < count)) out.append(new_text.data(), new_text.size());
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old_text, start);
    if (hit == absl::string_view::npos) break;
    out.append(s.data() + start, hit - start);
    out.append(new_text.data(), new_text.size());
    start = hit + old_text.size();
    ++done;
  }
  out.append(s.data() + start, s.size() - start);
  return out;
}

std::string PyUpper(absl::string_view s) { return IcuMap(s, /*upper=*/true); }
std::string PyLower(absl::string_view s) { return IcuMap(s, /*upper=*/false); }

std::string PyCapitalize(absl::string_view s) {
  if (s.empty()) return "";
  size_t pos = 0;
  const uint32_t first = NextCodePoint(s, &pos);
  std::string out;
  AppendUtf8(static_cast<uint32_t>(u_totitle(static_cast<UChar32>(first))), &out);
  out += PyLower(s.substr(pos));
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    if (IsCased(cp)) {
      const UChar32 mapped =
          prev_cased ? u_tolower(static_cast<UChar32>(cp)) : u_totitle(static_cast<UChar32>(cp));
      AppendUtf8(static_cast<uint32_t>(mapped), &out);
      prev_cased = true;
    } else {
      out.append(s.data() + start, pos - start);
      prev_cased = false;
    }
  }
  return out;
}

std::string JinjaTitle(absl::string_view s) {
  // re.split(r"([-\s({\[<]+)", s): words get item[0].upper() + item[1:].lower().
  std::string out;
  bool at_word_start = true;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    const bool sep = IsPySpace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (sep) {
      out.append(s.data() + start, pos - start);
      at_word_start = true;
      continue;
    }
    out += IcuMap(s.substr(start, pos - start), /*upper=*/at_word_start);
    at_word_start = false;
  }
  return out;
}

void AppendPyStrRepr(absl::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->push_back(quote);
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out->append("\\t");
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && !IsPrintable(cp))) {
      if (cp < 0x100) {
        absl::StrAppendFormat(out, "\\x%02x", cp);
      } else if (cp < 0x10000) {
        absl::StrAppendFormat(out, "\\u%04x", cp);
      } else {
        absl::StrAppendFormat(out, "\\U%08x", cp);
      }
    } else {
      out->append(s.data() + start, pos - start);
    }
  }
  out->push_back(quote);
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D[.DDD]e[+-]XX
  std::string text(buf);
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    absl::StrAppendFormat(&out, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out;
  }
  if (exponent < 0) {
    out += "0." + std::string(-exponent - 1, '0') + digits;
    return out;
  }
  const size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    out += digits + std::string(int_digits - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return out;
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    switch (cp) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", cp);
    } else if (ensure_ascii && cp >= 0x80) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        absl::StrAppendFormat(out, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        absl::StrAppendFormat(out, "\\u%04x", cp);
      }
    } else {
      out->append(s.data() + start, pos - start);
    }
  }
  out->push_back('"');
}

}  // namespace tandem::tokenizer::chat
