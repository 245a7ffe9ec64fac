#include "common/security/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/security/auth_status.h"

namespace tandem::security {
namespace {

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

bool PrintableNoSpace(absl::string_view s) {
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ApiKeySet> ApiKeySet::Parse(absl::string_view text) {
  ApiKeySet set;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("API key file line ", line_no);
    if (fields.size() > 3 || (fields.size() == 3 && fields[2] != "admin")) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected '<key> [<name> [admin]]'"));
    }
    if (fields[0].size() < kMinApiKeyChars || !PrintableNoSpace(fields[0])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a key is at least ", kMinApiKeyChars,
                                                     " printable ASCII characters"));
    }
    Entry entry;
    entry.digest = Sha256(fields[0]);
    entry.identity.name =
        fields.size() >= 2 ? std::string(fields[1]) : absl::StrCat("key-", line_no);
    entry.identity.admin = fields.size() == 3;
    for (const Entry& e : set.entries_) {
      if (e.digest == entry.digest) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate key"));
      }
    }
    set.entries_.push_back(std::move(entry));
  }
  return set;
}

absl::StatusOr<ApiKeySet> ApiKeySet::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read API key file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ApiKeySet> set = Parse(text.str());
  if (!set.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", set.status().message()));
  }
  if (set->empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no API key"));
  return set;
}

absl::StatusOr<ApiKeyIdentity> ApiKeySet::Authenticate(absl::string_view authorization) const {
  authorization = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return Unauthenticated("no bearer token");
  }
  return AuthenticateKey(absl::StripLeadingAsciiWhitespace(authorization.substr(kScheme.size())));
}

absl::StatusOr<ApiKeyIdentity> ApiKeySet::AuthenticateKey(absl::string_view key) const {
  // Hashing first makes every comparison the same length; no early exit over the entries.
  const std::array<uint8_t, 32> digest = Sha256(key);
  const Entry* match = nullptr;
  for (const Entry& e : entries_) {
    const bool equal = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) match = &e;
  }
  if (match == nullptr) return Unauthenticated("unknown API key");
  return match->identity;
}

}  // namespace tandem::security
