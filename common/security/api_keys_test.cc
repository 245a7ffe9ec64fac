#include "common/security/api_keys.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace tandem::security {
namespace {

constexpr char kFile[] =
    "# keys\n"
    "\n"
    "sk-alice-0123456789abcdef alice\n"
    "  sk-bob-0123456789abcdef   bob   admin  \n"
    "sk-anon-0123456789abcdef\n"
    "sk-alice-rotated-0123456789 alice\n";

TEST(ApiKeysTest, ParsesNamesAndAdmin) {
  absl::StatusOr<ApiKeySet> keys = ApiKeySet::Parse(kFile);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 4u);
  absl::StatusOr<ApiKeyIdentity> alice = keys->Authenticate("Bearer sk-alice-0123456789abcdef");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  EXPECT_FALSE(alice->admin);
  absl::StatusOr<ApiKeyIdentity> bob = keys->Authenticate("bearer   sk-bob-0123456789abcdef ");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->name, "bob");
  EXPECT_TRUE(bob->admin);
  absl::StatusOr<ApiKeyIdentity> anon = keys->AuthenticateKey("sk-anon-0123456789abcdef");
  ASSERT_TRUE(anon.ok());
  EXPECT_EQ(anon->name, "key-5");
  EXPECT_EQ(keys->AuthenticateKey("sk-alice-rotated-0123456789")->name, "alice");
}

TEST(ApiKeysTest, EveryFailureLooksTheSame) {
  absl::StatusOr<ApiKeySet> keys = ApiKeySet::Parse(kFile);
  ASSERT_TRUE(keys.ok());
  for (const char* bad :
       {"", "Bearer", "Bearer ", "Basic sk-alice-0123456789abcdef", "sk-alice-0123456789abcdef",
        "Bearer sk-alice-0123456789abcdeF", "Bearer sk-alice-0123456789abcde",
        "Bearer sk-alice-0123456789abcdefg", "Bearer alice"}) {
    absl::StatusOr<ApiKeyIdentity> id = keys->Authenticate(bad);
    ASSERT_FALSE(id.ok()) << bad;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(id.status().message(), "authentication failed") << bad;
  }
  EXPECT_FALSE(ApiKeySet().AuthenticateKey("sk-alice-0123456789abcdef").ok());
}

TEST(ApiKeysTest, RefusesBadFilesWithoutEchoingKeys) {
  for (const char* bad : {"short\n", "sk-0123456789abcdef a b\n", "sk-0123456789abcdef a admin x\n",
                          "sk-0123456789abcdef a\nsk-0123456789abcdef b\n"}) {
    absl::StatusOr<ApiKeySet> keys = ApiKeySet::Parse(bad);
    ASSERT_FALSE(keys.ok()) << bad;
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(keys.status().message()).find("0123456789"), std::string::npos)
        << keys.status();
  }
}

TEST(ApiKeysTest, LoadFile) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  EXPECT_EQ(ApiKeySet::LoadFile(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir + "/empty") << "# nothing\n";
  EXPECT_EQ(ApiKeySet::LoadFile(dir + "/empty").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/keys") << kFile;
  absl::StatusOr<ApiKeySet> keys = ApiKeySet::LoadFile(dir + "/keys");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 4u);
}

}  // namespace
}  // namespace tandem::security
