#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTripsWithItsMessage) {
  for (int c = 1; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), "why it failed");
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "why it failed");
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

TEST(GrpcStatusTest, OkStaysOkAndWhatPrefixesTheMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "ignored").ok());
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset"), "Handshake");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "Handshake: connection reset");
}

}  // namespace
}  // namespace tandem
