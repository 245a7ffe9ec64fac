#include "common/net.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(NetTest, WildcardsAndLoopback) {
  EXPECT_TRUE(IsWildcardHost("0.0.0.0"));
  EXPECT_TRUE(IsWildcardHost("::"));
  EXPECT_TRUE(IsWildcardHost("[::]"));
  EXPECT_TRUE(IsWildcardHost(""));
  EXPECT_FALSE(IsWildcardHost("127.0.0.1"));
  EXPECT_FALSE(IsWildcardHost("10.0.0.2"));
  absl::StatusOr<std::string> lo = InterfaceForAddress("127.0.0.1");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "lo");
  EXPECT_EQ(InterfaceForAddress("203.0.113.77").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(InterfaceForAddress("not-an-ip").status().code(), absl::StatusCode::kNotFound);
}

TEST(NetTest, FirstNonLoopbackAddressIsOneOfOurs) {
  absl::StatusOr<std::string> addr = FirstNonLoopbackAddress();
  if (!addr.ok()) {
    EXPECT_EQ(addr.status().code(), absl::StatusCode::kNotFound);  // a loopback-only sandbox
    return;
  }
  EXPECT_NE(*addr, "127.0.0.1");
  absl::StatusOr<std::string> iface = InterfaceForAddress(*addr);
  ASSERT_TRUE(iface.ok()) << iface.status();
  EXPECT_NE(*iface, "lo");
}

}  // namespace
}  // namespace tandem
