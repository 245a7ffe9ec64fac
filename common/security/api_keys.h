// API keys for the public plane (router gRPC `Router` service and the OpenAI-compatible HTTP
// API). Clients send `authorization: Bearer <key>` (gRPC metadata or HTTP header).
//
// Key file (`--api_key_file`), one key per line, `#` starts a comment line, blank lines skipped:
//
//   <key> [<name> [admin]]
//
// The name identifies the caller (request ids and Router.Abort are scoped to it; default
// "key-<line>"); several keys may share a name (rotation). `admin` keys may also call admin RPCs
// (ListWorkers) on the public port. Keys are at least 16 characters of printable ASCII without
// spaces. Only SHA-256 digests are kept in memory; a presented key is hashed and compared with
// every stored digest in constant time (no early exit), so timing says nothing about which key
// or how much of it matched. Every failure is the same UNAUTHENTICATED status.
//
// Thread safety: immutable after Parse/Load; Authenticate is const and thread-safe.
#ifndef TANDEM_COMMON_SECURITY_API_KEYS_H_
#define TANDEM_COMMON_SECURITY_API_KEYS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::security {

inline constexpr size_t kMinApiKeyChars = 16;

struct ApiKeyIdentity {
  std::string name;
  bool admin = false;
};

class ApiKeySet {
 public:
  ApiKeySet() = default;  // empty: no keys configured
  // INVALID_ARGUMENT naming the line (never echoing the key) for a malformed or duplicate key.
  static absl::StatusOr<ApiKeySet> Parse(absl::string_view text);
  // NOT_FOUND / PERMISSION_DENIED when unreadable, INVALID_ARGUMENT for its content (and for a
  // file without any key: an empty key file would silently turn authentication off).
  static absl::StatusOr<ApiKeySet> LoadFile(const std::string& path);

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // `authorization`: the header's value, "Bearer <key>" (scheme case-insensitive). UNAUTHENTICATED
  // ("invalid or missing API key") for any failure.
  absl::StatusOr<ApiKeyIdentity> Authenticate(absl::string_view authorization) const;
  // The key itself (no scheme).
  absl::StatusOr<ApiKeyIdentity> AuthenticateKey(absl::string_view key) const;

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;
    ApiKeyIdentity identity;
  };
  std::vector<Entry> entries_;
};

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_API_KEYS_H_
