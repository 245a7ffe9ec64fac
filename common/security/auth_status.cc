#include "common/security/auth_status.h"

#include "common/logging.h"

namespace tandem::security {

absl::Status Unauthenticated(absl::string_view reason) {
  VLOG(1) << "unauthenticated: " << reason;
  return absl::UnauthenticatedError(kUnauthenticatedMessage);
}

absl::Status PermissionDenied(absl::string_view reason) {
  VLOG(1) << "permission denied: " << reason;
  return absl::PermissionDeniedError(kPermissionDeniedMessage);
}

absl::Status Opaque(const absl::Status& status) {
  if (status.ok()) return status;
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    return Unauthenticated(status.message());
  }
  return PermissionDenied(status.message());
}

}  // namespace tandem::security
