#include "common/security/test_certs.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem::security {

std::string MakeCertsScript() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "tandem", "/deploy/certs/make_certs.sh");
}

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& subdir,
                                        const std::vector<std::string>& args) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  TestCerts certs;
  certs.dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", subdir);
  std::string command = absl::StrCat("'", MakeCertsScript(), "' '", certs.dir, "'");
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " > /dev/null");
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("failed: ", command));
  }
  return certs;
}

SecurityConfig TestCerts::Config(const std::string& name) const {
  SecurityOptions options;
  options.files = Files(name);
  absl::StatusOr<SecurityConfig> config = LoadSecurityConfig(options);
  if (!config.ok()) {
    std::fprintf(stderr, "TestCerts::Config(%s): %s\n", name.c_str(),
                 config.status().ToString().c_str());
    std::abort();
  }
  return *std::move(config);
}

}  // namespace tandem::security
