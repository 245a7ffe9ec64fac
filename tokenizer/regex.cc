#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF: the subject is UTF-8 (validated by the caller: NO_UTF_CHECK at match time); UCP: \s,
  // \w, \d and POSIX classes by Unicode properties.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex '", std::string(pattern), "' at offset ",
                                                   offset, ": ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // interpreted when the JIT is unavailable
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::~Regex() { pcre2_code_free(code_); }

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::FindAll(
    absl::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
  if (data == nullptr) return absl::ResourceExhaustedError("regex: no match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  absl::Status status;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = absl::InternalError(
          absl::StrCat("regex '", pattern_, "': ", reinterpret_cast<char*>(message)));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      if (begin >= text.size()) break;
      size_t next = begin + 1;
      while (next < text.size() && (static_cast<uint8_t>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
    }
  }
  pcre2_match_data_free(data);
  if (!status.ok()) return status;
  return out;
}

}  // namespace tandem::tokenizer
