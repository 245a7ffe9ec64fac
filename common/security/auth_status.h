// Failed authentication / authorization as statuses that say nothing about what failed.
//
// A caller learns only UNAUTHENTICATED ("authentication failed": no credentials, an unknown key,
// a certificate that is not the CA's) or PERMISSION_DENIED ("permission denied": authenticated,
// but the role may not make this call). Which key, which part of the certificate, or which check
// failed is logged on the server at VLOG(1) and never sent.
//
// Thread safety: pure functions.
#ifndef TANDEM_COMMON_SECURITY_AUTH_STATUS_H_
#define TANDEM_COMMON_SECURITY_AUTH_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem::security {

inline constexpr absl::string_view kUnauthenticatedMessage = "authentication failed";
inline constexpr absl::string_view kPermissionDeniedMessage = "permission denied";

// `reason` is logged (VLOG 1), not returned.
absl::Status Unauthenticated(absl::string_view reason);
absl::Status PermissionDenied(absl::string_view reason);

// OK stays OK; UNAUTHENTICATED stays UNAUTHENTICATED; every other failure of a security check
// becomes PERMISSION_DENIED; the message is replaced by the generic one either way.
absl::Status Opaque(const absl::Status& status);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_AUTH_STATUS_H_
