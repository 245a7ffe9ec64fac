// Test certificates: runs deploy/certs/make_certs.sh (a data dependency) into a fresh directory
// under TEST_TMPDIR, so tests exercise the same certificates the launchers use.
//
//   absl::StatusOr<TestCerts> certs = MakeTestCerts("cluster");
//   SecurityConfig router = certs->Config("router");   // router.pem/key + ca.pem, TLS on
//
// Thread safety: call from the test's main thread.
#ifndef TANDEM_COMMON_SECURITY_TEST_CERTS_H_
#define TANDEM_COMMON_SECURITY_TEST_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security/security_config.h"

namespace tandem::security {

struct TestCerts {
  std::string dir;
  std::string Pem(const std::string& name) const { return dir + "/" + name + ".pem"; }
  std::string Key(const std::string& name) const { return dir + "/" + name + ".key"; }
  std::string Ca() const { return dir + "/ca.pem"; }
  TlsFiles Files(const std::string& name) const { return {Pem(name), Key(name), Ca()}; }
  // A loaded TLS config presenting NAME's certificate; aborts the test binary on failure.
  SecurityConfig Config(const std::string& name) const;
};

// The script's path in the runfiles.
std::string MakeCertsScript();
// `subdir` under TEST_TMPDIR (created); `args` are passed on (e.g. "--cert=x:admin").
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& subdir,
                                        const std::vector<std::string>& args = {});

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_TEST_CERTS_H_
