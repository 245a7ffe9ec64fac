#include "common/security/roles.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/security/internal_policy.h"
#include "common/security/security_config.h"
#include "common/security/test_certs.h"

namespace tandem::security {
namespace {

std::string ReadOrDie(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadPemFile(path, "test");
  EXPECT_TRUE(pem.ok()) << pem.status();
  return pem.ok() ? *pem : std::string();
}

// A self-signed certificate with the given subject and extra openssl -addext arguments.
std::string SelfSigned(const std::string& name, const std::string& subject,
                       const std::string& addext) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  const std::string cmd = absl::StrCat(
      "mkdir -p ", dir,
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -keyout ",
      dir, "/k.pem -out ", dir, "/c.pem -days 2 -subj '", subject, "' ", addext, " 2>/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return ReadOrDie(dir + "/c.pem");
}

TEST(RolesTest, NamesRoundTrip) {
  for (Role r :
       {Role::kRouter, Role::kPrefill, Role::kDecode, Role::kMixed, Role::kAdmin, Role::kClient}) {
    EXPECT_EQ(ParseRole(RoleName(r)), r);
  }
  EXPECT_FALSE(ParseRole("worker").has_value());
  EXPECT_FALSE(ParseRole("").has_value());
  EXPECT_TRUE(IsWorkerRole(Role::kMixed));
  EXPECT_FALSE(IsWorkerRole(Role::kRouter));
  EXPECT_EQ((RoleSet{Role::kRouter, Role::kAdmin}).ToString(), "router|admin");
}

TEST(RolesTest, EveryGeneratedCertificateNamesItsRole) {
  absl::StatusOr<TestCerts> certs = MakeTestCerts("certs", {"--cert=prefill-7:prefill"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  for (const char* name : {"router", "prefill", "decode", "mixed", "admin", "client"}) {
    absl::StatusOr<PeerIdentity> id = IdentityFromCertificatePem(ReadOrDie(certs->Pem(name)));
    ASSERT_TRUE(id.ok()) << name << ": " << id.status();
    EXPECT_EQ(RoleName(id->role), name);
    EXPECT_EQ(id->name, name);
  }
  absl::StatusOr<PeerIdentity> extra =
      IdentityFromCertificatePem(ReadOrDie(certs->Pem("prefill-7")));
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_EQ(extra->role, Role::kPrefill);
  EXPECT_EQ(extra->ToString(), "prefill:prefill-7");
}

TEST(RolesTest, WorkerCertificatesNameTheirWorker) {
  absl::StatusOr<TestCerts> certs = MakeTestCerts("workers", {"--worker=decode-3:decode"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<PeerIdentity> id = IdentityFromCertificatePem(ReadOrDie(certs->Pem("decode-3")));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kDecode);
  EXPECT_EQ(id->worker_id, "decode-3");
  EXPECT_EQ(id->name, "decode-3");
  EXPECT_EQ(id->ToString(), "decode:decode-3/worker/decode-3");
  absl::StatusOr<PeerIdentity> role_only =
      IdentityFromCertificatePem(ReadOrDie(certs->Pem("decode")));
  ASSERT_TRUE(role_only.ok()) << role_only.status();
  EXPECT_EQ(role_only->worker_id, "");
  EXPECT_EQ(IdentityUri(Role::kDecode, "d-1"), "spiffe://tandem/role/decode/worker/d-1");
  EXPECT_EQ(IdentityUri(Role::kRouter), "spiffe://tandem/role/router");
  EXPECT_TRUE(IsValidWorkerId("tandem-decode-0.x_1"));
  EXPECT_FALSE(IsValidWorkerId(""));
  EXPECT_FALSE(IsValidWorkerId("a/b"));
  EXPECT_FALSE(IsValidWorkerId(std::string(129, 'a')));
  // The role-only and the per-worker form of one role together: the worker id stands.
  const std::string both = SelfSigned(
      "both", "/CN=x",
      "-addext subjectAltName=URI:spiffe://tandem/role/mixed,URI:spiffe://tandem/role/mixed/"
      "worker/m-0");
  absl::StatusOr<PeerIdentity> both_id = IdentityFromCertificatePem(both);
  ASSERT_TRUE(both_id.ok()) << both_id.status();
  EXPECT_EQ(both_id->worker_id, "m-0");
  // Two workers, a malformed id, a worker URI whose role conflicts with the OU: refused.
  for (const auto& [name, subject, san] : std::vector<std::array<std::string, 3>>{
           {"two_workers", "/CN=x",
            "URI:spiffe://tandem/role/decode/worker/a,URI:spiffe://tandem/role/decode/worker/b"},
           {"bad_id", "/CN=x", "URI:spiffe://tandem/role/decode/worker/a%2Fb"},
           {"empty_id", "/CN=x", "URI:spiffe://tandem/role/decode/worker/"},
           {"ou_conflict", "/OU=prefill/CN=x", "URI:spiffe://tandem/role/decode/worker/a"}}) {
    const std::string pem = SelfSigned(name, subject, "-addext subjectAltName=" + san);
    EXPECT_EQ(IdentityFromCertificatePem(pem).status().code(), absl::StatusCode::kPermissionDenied)
        << name;
  }
}

TEST(RolesTest, RoleFromOuWhenNoUri) {
  absl::StatusOr<PeerIdentity> id =
      IdentityFromCertificatePem(SelfSigned("ou", "/OU=decode/CN=d1", ""));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kDecode);
  EXPECT_EQ(id->name, "d1");
}

TEST(RolesTest, RefusesCertificatesWithoutOrWithConflictingRoles) {
  const std::string none = SelfSigned("none", "/OU=ops/CN=x", "");
  EXPECT_EQ(IdentityFromCertificatePem(none).status().code(), absl::StatusCode::kPermissionDenied);
  const std::string conflict = SelfSigned("conflict", "/OU=admin/CN=x",
                                          "-addext subjectAltName=URI:spiffe://tandem/role/decode");
  EXPECT_EQ(IdentityFromCertificatePem(conflict).status().code(),
            absl::StatusCode::kPermissionDenied);
  const std::string two_uris = SelfSigned(
      "two", "/CN=x",
      "-addext subjectAltName=URI:spiffe://tandem/role/decode,URI:spiffe://tandem/role/router");
  EXPECT_EQ(IdentityFromCertificatePem(two_uris).status().code(),
            absl::StatusCode::kPermissionDenied);
  const std::string unknown =
      SelfSigned("unknown", "/CN=x", "-addext subjectAltName=URI:spiffe://tandem/role/root");
  EXPECT_EQ(IdentityFromCertificatePem(unknown).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Other URIs are ignored; the role URI decides.
  const std::string other =
      SelfSigned("other", "/CN=x",
                 "-addext subjectAltName=URI:https://example.com/x,URI:spiffe://tandem/role/mixed");
  absl::StatusOr<PeerIdentity> id = IdentityFromCertificatePem(other);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kMixed);
  EXPECT_EQ(IdentityFromCertificatePem("not a cert").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InternalPolicyTest, Table) {
  auto allowed = [](absl::string_view method, Role role) {
    return AuthorizeInternalCall(method, PeerIdentity{role, "x", ""}).ok();
  };
  for (Role w : {Role::kPrefill, Role::kDecode, Role::kMixed}) {
    EXPECT_TRUE(allowed("/tandem.v1.WorkerRegistry/RegisterWorker", w));
    EXPECT_TRUE(allowed("/tandem.v1.WorkerRegistry/Heartbeat", w));
    EXPECT_TRUE(allowed("/tandem.v1.KvTransferService/ReleaseLease", w));
    EXPECT_FALSE(allowed("/tandem.v1.WorkerService/Prefill", w));
    EXPECT_FALSE(allowed("/tandem.v1.Router/ListWorkers", w));
  }
  for (Role r : {Role::kRouter, Role::kAdmin, Role::kClient}) {
    EXPECT_FALSE(allowed("/tandem.v1.WorkerRegistry/RegisterWorker", r));
    EXPECT_FALSE(allowed("/tandem.v1.KvTransferService/Handshake", r));
  }
  EXPECT_TRUE(allowed("/tandem.v1.WorkerService/Prefill", Role::kRouter));
  EXPECT_TRUE(allowed("/tandem.v1.WorkerService/Abort", Role::kRouter));
  EXPECT_FALSE(allowed("/tandem.v1.WorkerService/Abort", Role::kAdmin));
  EXPECT_TRUE(allowed("/tandem.v1.WorkerService/Stats", Role::kAdmin));
  EXPECT_TRUE(allowed("/tandem.v1.WorkerService/Health", Role::kAdmin));
  EXPECT_TRUE(allowed("/tandem.v1.Router/ListWorkers", Role::kAdmin));
  EXPECT_FALSE(allowed("/tandem.v1.Router/ListWorkers", Role::kRouter));
  EXPECT_FALSE(allowed("/tandem.v1.Router/Generate", Role::kAdmin));  // not internal
  EXPECT_FALSE(allowed("/tandem.v1.WorkerService/", Role::kRouter));
  EXPECT_FALSE(allowed("/grpc.health.v1.Health/Check", Role::kRouter));  // default deny
  absl::Status denied = AuthorizeInternalCall("/x/y", PeerIdentity{Role::kRouter, "r", ""});
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.message(), "permission denied");
}

}  // namespace
}  // namespace tandem::security
