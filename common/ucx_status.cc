#include "common/ucx_status.h"

#include <ucs/type/status.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusCode UcxStatusCode(ucs_status_t status) {
  if (status == UCS_OK) return absl::StatusCode::kOk;
  if (status == UCS_ERR_ENDPOINT_TIMEOUT) return absl::StatusCode::kDeadlineExceeded;
  // Whole ranges UCX reserves for transport failures: the peer or the link is gone.
  if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
    return absl::StatusCode::kUnavailable;
  }
  switch (status) {
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_BUFFER_TOO_SMALL:
    case UCS_ERR_OUT_OF_RANGE:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::StatusCode::kInvalidArgument;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_SHMEM_SEGMENT:
      return absl::StatusCode::kResourceExhausted;
    case UCS_ERR_TIMED_OUT:
      return absl::StatusCode::kDeadlineExceeded;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_BUSY:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return absl::StatusCode::kUnavailable;
    case UCS_ERR_CANCELED:
      return absl::StatusCode::kCancelled;
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NOT_IMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case UCS_ERR_NO_ELEM:
      return absl::StatusCode::kNotFound;
    case UCS_ERR_ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status UcxStatus(ucs_status_t status, const CallSite& site) {
  if (status == UCS_OK) return absl::OkStatus();
  const char* description = ucs_status_string(status);
  if (status == UCS_INPROGRESS) {
    return LibraryError(absl::StatusCode::kInternal, "UCX", "UCS_INPROGRESS",
                        "operation still in progress; not a final status", site);
  }
  return LibraryError(UcxStatusCode(status), "UCX",
                      absl::StrCat("UCS status ", static_cast<int>(status)), description, site);
}

}  // namespace tandem
