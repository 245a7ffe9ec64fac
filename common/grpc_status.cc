#include "common/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

// Both enums follow google.rpc.Code; a static check keeps the cast honest.
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
              static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (what.empty()) return absl::Status(code, status.error_message());
  return absl::Status(code, absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace tandem
