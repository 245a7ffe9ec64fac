// SecurityConfig: what one process needs to speak on Tandem's planes, loaded once at startup
// from the flags every daemon and the CLI share (common/security/flags.h) or built by tests.
//
//   insecure      plain text, no peer checks, no API keys unless a key file is given (the
//                 daemons log this at WARNING on startup). A default-constructed config is
//                 insecure: in-process unit tests keep working without certificates.
//   tls           this process's certificate chain + key (PEM) and the cluster CA that every
//                 internal peer's certificate must chain to (mTLS).
//   self          the role and name this process's own certificate asserts.
//   api_keys      keys accepted on the public plane (router only; empty: none required).
//
// Thread safety: a value; copy freely (keys are small).
#ifndef TANDEM_COMMON_SECURITY_SECURITY_CONFIG_H_
#define TANDEM_COMMON_SECURITY_SECURITY_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security/api_keys.h"
#include "common/security/roles.h"

namespace tandem::security {

struct TlsFiles {
  std::string cert;  // PEM certificate (chain), leaf first
  std::string key;   // PEM private key
  std::string ca;    // PEM CA bundle peers must chain to
};

struct TlsMaterial {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
};

struct SecurityConfig {
  bool insecure = true;
  TlsMaterial tls;
  std::optional<PeerIdentity> self;
  ApiKeySet api_keys;
  // Expected name in peers' server certificates instead of the dialled host (a SAN every
  // certificate carries, when addresses are not known when certificates are made). Empty: the
  // host of the address dialled.
  std::string server_name_override;

  bool has_client_cert() const { return !tls.cert_pem.empty(); }
};

struct SecurityOptions {
  bool insecure = false;
  TlsFiles files;
  std::string api_key_file;
  std::string server_name_override;
  // What this process cannot run without (unless insecure): daemons need all three files; the
  // CLI needs only the CA (a client certificate is for admin calls).
  bool require_cert = true;
  bool require_ca = true;
};

// Reads and checks the files: the key must match the certificate, the certificate must name a
// role (roles.h) and chain to the CA. INVALID_ARGUMENT naming the flag for a missing or
// conflicting one (--insecure with --tls_*), NOT_FOUND for an unreadable file.
absl::StatusOr<SecurityConfig> LoadSecurityConfig(const SecurityOptions& options);

// Reads a whole (small) file; NOT_FOUND naming `what` and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what);

// A 32-byte secret for `purpose` that only holders of this process's private key can compute:
// HMAC-SHA256(key = the private key's PEM, purpose). Every process started with the same key
// (the ranks of one worker group) derives the same secret, with no exchange. Empty for an
// insecure config or one without a key.
std::string DeriveSecret(const SecurityConfig& config, absl::string_view purpose);

// One line for the startup log: "TLS as prefill:prefill-0 (CA ...), 2 API keys" or the
// insecure warning text.
std::string Describe(const SecurityConfig& config);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_SECURITY_CONFIG_H_
