// UCX (ucs_status_t) -> absl::Status conversion.
//
//   UCX_RETURN_IF_ERROR(ucp_worker_progress_or_call(...));
//   absl::Status s = UcxStatus(status, {"ucp_ep_create", __FILE__, __LINE__});
//
// Code mapping: UCS_OK -> OK; invalid parameters -> INVALID_ARGUMENT; out of memory or
// resources -> RESOURCE_EXHAUSTED; timeouts -> DEADLINE_EXCEEDED; unreachable, reset or
// rejected peers -> UNAVAILABLE; canceled -> CANCELLED; unsupported -> UNIMPLEMENTED;
// anything else -> INTERNAL. UCS_INPROGRESS is not a final status: passing it is a caller
// bug and yields INTERNAL.
#ifndef TANDEM_COMMON_UCX_STATUS_H_
#define TANDEM_COMMON_UCX_STATUS_H_

#include <ucs/type/status.h>

#include "absl/status/status.h"
#include "common/error_status.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusCode UcxStatusCode(ucs_status_t status);
absl::Status UcxStatus(ucs_status_t status, const CallSite& site);

}  // namespace tandem

#define UCX_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::UcxStatus((expr), {#expr, __FILE__, __LINE__}))

#endif  // TANDEM_COMMON_UCX_STATUS_H_
