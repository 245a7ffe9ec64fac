// absl::Status <-> grpc::Status at the gRPC edge (ARCHITECTURE.md: absl::Status inside, gRPC
// codes only at the edges). The canonical codes are numbered alike in both, so the code maps
// one to one; messages are kept (FromGrpc may prefix what failed).
//
// Thread safety: pure functions.
#ifndef TANDEM_COMMON_GRPC_STATUS_H_
#define TANDEM_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

grpc::Status ToGrpcStatus(const absl::Status& status);
// `what` (optional) prefixes the message: "what: message".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what = "");

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_STATUS_H_
