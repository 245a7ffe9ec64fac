#include "common/security/flags.h"

#include "absl/flags/flag.h"
#include "common/logging.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate of this process (its role is in the cert)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM cluster CA: peers' certificates must chain to it");
ABSL_FLAG(std::string, api_key_file, "",
          "API keys accepted on the public plane, one per line: KEY [NAME [admin]]");
ABSL_FLAG(std::string, tls_server_name, "",
          "expect this name in peers' server certificates instead of the dialled host");
ABSL_FLAG(bool, insecure, false,
          "plain text without TLS or peer authentication (for tests; logged as a warning)");

namespace tandem::security {

SecurityOptions SecurityOptionsFromFlags(bool require_cert, bool require_ca) {
  SecurityOptions o;
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.files.cert = absl::GetFlag(FLAGS_tls_cert);
  o.files.key = absl::GetFlag(FLAGS_tls_key);
  o.files.ca = absl::GetFlag(FLAGS_tls_ca);
  o.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  o.server_name_override = absl::GetFlag(FLAGS_tls_server_name);
  o.require_cert = require_cert;
  o.require_ca = require_ca;
  return o;
}

absl::StatusOr<SecurityConfig> DaemonSecurityFromFlags(absl::string_view program) {
  absl::StatusOr<SecurityConfig> config = LoadSecurityConfig(SecurityOptionsFromFlags());
  if (!config.ok()) return config.status();
  if (config->insecure) {
    LOG(WARNING) << "**************************************************************";
    LOG(WARNING) << program << ": " << Describe(*config);
    LOG(WARNING) << "anyone who can reach its ports can call every RPC; use TLS outside tests";
    LOG(WARNING) << "**************************************************************";
  } else {
    LOG(INFO) << program << ": " << Describe(*config);
  }
  return config;
}

}  // namespace tandem::security
