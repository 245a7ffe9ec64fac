#include "common/nccl_status.h"

#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace tandem {
absl::StatusCode NcclStatusCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
    case ncclInProgress:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclStatus(ncclResult_t result, const CallSite& site) {
  if (result == ncclSuccess) return absl::OkStatus();
  return LibraryError(NcclStatusCode(result), "NCCL",
                      absl::StrCat("ncclResult_t ", static_cast<int>(result)),
                      ncclGetErrorString(result), site);
}

}  // namespace tandem
