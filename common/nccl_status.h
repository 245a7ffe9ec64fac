// NCCL error -> absl::Status conversion (CUDA builds only).
//
//   NCCL_RETURN_IF_ERROR(ncclAllReduce(...));
//
// Codes: invalid argument/usage -> INVALID_ARGUMENT; system/remote error -> UNAVAILABLE (a
// peer or the network failed); in progress -> UNAVAILABLE (retry); else INTERNAL.
#ifndef TANDEM_COMMON_NCCL_STATUS_H_
#define TANDEM_COMMON_NCCL_STATUS_H_

#include <nccl.h>

#include "absl/status/status.h"
#include "common/error_status.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusCode NcclStatusCode(ncclResult_t result);
absl::Status NcclStatus(ncclResult_t result, const CallSite& site);

}  // namespace tandem

#define NCCL_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::tandem::NcclStatus((expr), {#expr, __FILE__, __LINE__}))

#endif  // TANDEM_COMMON_NCCL_STATUS_H_
