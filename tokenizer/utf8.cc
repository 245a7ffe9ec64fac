#include "tokenizer/utf8.h"

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {
namespace {

// Length of the valid character at bytes[pos] (1..4), or 0 when it is invalid; then *subpart is
// the length of the maximal invalid subpart (>= 1), or 0 when the bytes end mid-character while
// still valid (an incomplete character).
int CharAt(absl::string_view bytes, size_t pos, int* subpart) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t c = b(pos);
  *subpart = 1;
  if (c < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (Unicode Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;  // C0, C1, F5..FF, or a stray continuation byte
  }
  for (int k = 1; k < len; ++k) {
    if (pos + k >= bytes.size()) {
      *subpart = 0;  // valid so far, incomplete
      return 0;
    }
    const uint8_t x = b(pos + k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) {
      *subpart = k;
      return 0;
    }
  }
  return len;
}

}  // namespace

absl::Status ValidateUtf8(absl::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    int subpart = 0;
    const int len = CharAt(text, pos, &subpart);
    if (len == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 (byte ", pos, ": 0x",
                       absl::Hex(static_cast<uint8_t>(text[pos]), absl::kZeroPad2), ")"));
    }
    pos += len;
  }
  return absl::OkStatus();
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    int subpart = 0;
    const int len = CharAt(bytes, pos, &subpart);
    if (len > 0) {
      out.append(bytes.data() + pos, len);
      pos += len;
      continue;
    }
    out.append("\xEF\xBF\xBD");
    pos += subpart == 0 ? bytes.size() - pos : subpart;  // an incomplete tail is one subpart
  }
  return out;
}

std::string Utf8LossyPerByte(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    int subpart = 0;
    const int len = CharAt(bytes, pos, &subpart);
    if (len > 0) {
      out.append(bytes.data() + pos, len);
      pos += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++pos;
    }
  }
  return out;
}

size_t Utf8FinalPrefix(absl::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    int subpart = 0;
    const int len = CharAt(bytes, pos, &subpart);
    if (len > 0) {
      pos += len;
    } else if (subpart > 0) {
      pos += subpart;
    } else {
      break;  // incomplete: later bytes may complete it
    }
  }
  return pos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t NextCodePoint(absl::string_view text, size_t* pos) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(text[i])); };
  const uint32_t c = b(*pos);
  if (c < 0x80) {
    *pos += 1;
    return c;
  }
  if (c < 0xE0) {
    const uint32_t cp = ((c & 0x1F) << 6) | (b(*pos + 1) & 0x3F);
    *pos += 2;
    return cp;
  }
  if (c < 0xF0) {
    const uint32_t cp = ((c & 0x0F) << 12) | ((b(*pos + 1) & 0x3F) << 6) | (b(*pos + 2) & 0x3F);
    *pos += 3;
    return cp;
  }
  const uint32_t cp = ((c & 0x07) << 18) | ((b(*pos + 1) & 0x3F) << 12) |
                      ((b(*pos + 2) & 0x3F) << 6) | (b(*pos + 3) & 0x3F);
  *pos += 4;
  return cp;
}

}  // namespace tandem::tokenizer
