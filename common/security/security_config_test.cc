#include "common/security/security_config.h"

#include <gtest/gtest.h>

#include "common/security/test_certs.h"

namespace tandem::security {
namespace {

class SecurityConfigTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> a = MakeTestCerts("a");
    absl::StatusOr<TestCerts> b = MakeTestCerts("b");
    ASSERT_TRUE(a.ok() && b.ok());
    certs_ = new TestCerts(*a);
    other_ = new TestCerts(*b);
  }
  static TestCerts* certs_;
  static TestCerts* other_;  // another CA
};
TestCerts* SecurityConfigTest::certs_ = nullptr;
TestCerts* SecurityConfigTest::other_ = nullptr;

TEST_F(SecurityConfigTest, LoadsADaemonsFiles) {
  SecurityOptions o;
  o.files = certs_->Files("decode");
  absl::StatusOr<SecurityConfig> c = LoadSecurityConfig(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->insecure);
  ASSERT_TRUE(c->self.has_value());
  EXPECT_EQ(c->self->role, Role::kDecode);
  EXPECT_TRUE(c->has_client_cert());
  EXPECT_NE(Describe(*c).find("decode:decode"), std::string::npos) << Describe(*c);
}

TEST_F(SecurityConfigTest, RefusesMismatchedOrForeignFiles) {
  SecurityOptions o;
  o.files = certs_->Files("decode");
  o.files.key = certs_->Key("router");
  EXPECT_EQ(LoadSecurityConfig(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.files = certs_->Files("decode");
  o.files.ca = other_->Ca();  // our certificate does not chain to the CA we trust
  absl::Status s = LoadSecurityConfig(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not chain"), std::string::npos) << s;
  o.files = certs_->Files("decode");
  o.files.cert = certs_->dir + "/nope.pem";
  EXPECT_EQ(LoadSecurityConfig(o).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SecurityConfigTest, InsecureMustBeExplicit) {
  SecurityOptions o;  // nothing given
  absl::Status s = LoadSecurityConfig(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--insecure"), std::string::npos) << s;
  o.insecure = true;
  absl::StatusOr<SecurityConfig> c = LoadSecurityConfig(o);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->insecure);
  EXPECT_NE(Describe(*c).find("INSECURE"), std::string::npos);
  o.files.ca = certs_->Ca();
  EXPECT_EQ(LoadSecurityConfig(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SecurityConfigTest, ClientWithOnlyTheCa) {
  SecurityOptions o;
  o.require_cert = false;
  o.files.ca = certs_->Ca();
  absl::StatusOr<SecurityConfig> c = LoadSecurityConfig(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_client_cert());
  EXPECT_FALSE(c->self.has_value());
  o.files.cert = certs_->Pem("admin");  // without its key
  EXPECT_EQ(LoadSecurityConfig(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// The ranks of a worker group share the worker's key, so they derive the same secret; another
// key, another purpose or no key at all derives another (or none).
TEST_F(SecurityConfigTest, DerivedSecretsFollowTheKey) {
  const SecurityConfig prefill = certs_->Config("prefill");
  const std::string a = DeriveSecret(prefill, "purpose a");
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(DeriveSecret(certs_->Config("prefill"), "purpose a"), a);
  EXPECT_NE(DeriveSecret(prefill, "purpose b"), a);
  EXPECT_NE(DeriveSecret(certs_->Config("decode"), "purpose a"), a);
  EXPECT_EQ(DeriveSecret(SecurityConfig(), "purpose a"), "");
}

}  // namespace
}  // namespace tandem::security
