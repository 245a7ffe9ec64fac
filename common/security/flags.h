// The security flags every daemon and tandem_cli share (one definition, linked once per binary):
//
//   --tls_cert=PEM --tls_key=PEM   this process's certificate and key (deploy/certs/make_certs.sh)
//   --tls_ca=PEM                   the cluster CA every internal peer must chain to
//   --api_key_file=PATH            public-plane API keys (router; api_keys.h for the format)
//   --tls_server_name=NAME         expect NAME in peers' server certificates instead of the host
//   --insecure                     plain text, no peer authentication (logged at WARNING)
//
// Thread safety: call from main after flag parsing.
#ifndef TANDEM_COMMON_SECURITY_FLAGS_H_
#define TANDEM_COMMON_SECURITY_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security/security_config.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, api_key_file);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(bool, insecure);

namespace tandem::security {

// The flags as options (require_cert / require_ca as given).
SecurityOptions SecurityOptionsFromFlags(bool require_cert = true, bool require_ca = true);

// Loads the daemon's config from the flags and logs how it will talk: INFO for TLS, a loud
// WARNING block for --insecure. `program` names the daemon in the log.
absl::StatusOr<SecurityConfig> DaemonSecurityFromFlags(absl::string_view program);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_FLAGS_H_
