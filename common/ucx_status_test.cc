#include "common/ucx_status.h"

#include <ucs/type/status.h>

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

absl::Status Forward(ucs_status_t s) {
  UCX_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

TEST(UcxStatusTest, OkIsOk) {
  EXPECT_TRUE(UcxStatus(UCS_OK, {"x", __FILE__, __LINE__}).ok());
  EXPECT_TRUE(Forward(UCS_OK).ok());
}

TEST(UcxStatusTest, MapsCodes) {
  EXPECT_EQ(UcxStatusCode(UCS_ERR_INVALID_PARAM), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_NO_MEMORY), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_TIMED_OUT), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_ENDPOINT_TIMEOUT), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_CONNECTION_RESET), absl::StatusCode::kUnavailable);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_UNREACHABLE), absl::StatusCode::kUnavailable);
  // Every code in the link- and endpoint-failure ranges means the peer is gone.
  for (int s = UCS_ERR_FIRST_LINK_FAILURE; s >= UCS_ERR_LAST_ENDPOINT_FAILURE; --s) {
    if (s == UCS_ERR_ENDPOINT_TIMEOUT) continue;
    auto st = static_cast<ucs_status_t>(s);
    if (UCS_IS_LINK_ERROR(st) || UCS_IS_ENDPOINT_ERROR(st)) {
      EXPECT_EQ(UcxStatusCode(st), absl::StatusCode::kUnavailable) << s;
    }
  }
  EXPECT_EQ(UcxStatusCode(UCS_ERR_CANCELED), absl::StatusCode::kCancelled);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_UNSUPPORTED), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(UcxStatusCode(UCS_ERR_NO_MESSAGE), absl::StatusCode::kInternal);
}

TEST(UcxStatusTest, MessageNamesSiteLibraryAndCall) {
  absl::Status s = Forward(UCS_ERR_CONNECTION_RESET);
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable);
  std::string msg(s.message());
  EXPECT_NE(msg.find("ucx_status_test.cc:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("UCX error"), std::string::npos) << msg;
  EXPECT_NE(msg.find(ucs_status_string(UCS_ERR_CONNECTION_RESET)), std::string::npos) << msg;
  EXPECT_NE(msg.find("`s`"), std::string::npos) << msg;
}

TEST(UcxStatusTest, InProgressIsACallerBug) {
  absl::Status s = UcxStatus(UCS_INPROGRESS, {"ucp_get_nbx", __FILE__, __LINE__});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("not a final status"), std::string::npos);
}

}  // namespace
}  // namespace tandem
