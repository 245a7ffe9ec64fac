// The gRPC-port flags both daemons share (tandem_router: each of its ports; tandem_worker: its
// port), one definition linked once per binary, read into GrpcListenerOptions:
//
//   --grpc_max_connections=4096          open connections at most (also a quarter of the fd limit)
//   --grpc_handshake_timeout_ms=30000    TLS handshake + HTTP/2 preface, or the connection is
//   dropped
//   --grpc_max_concurrent_streams=8192   calls open at once on one connection
//   --grpc_memory_quota_mb=4096          the port's connections' memory (grpc::ResourceQuota)
//
// Thread safety: call from main after flag parsing.
#ifndef TANDEM_COMMON_GRPC_LISTENER_FLAGS_H_
#define TANDEM_COMMON_GRPC_LISTENER_FLAGS_H_

#include <cstdint>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/grpc_listener_options.h"

ABSL_DECLARE_FLAG(int32_t, grpc_max_connections);
ABSL_DECLARE_FLAG(int64_t, grpc_handshake_timeout_ms);
ABSL_DECLARE_FLAG(int32_t, grpc_max_concurrent_streams);
ABSL_DECLARE_FLAG(int64_t, grpc_memory_quota_mb);

namespace tandem {

// The flags as options; INVALID_ARGUMENT naming the flags when one is below 1.
absl::StatusOr<GrpcListenerOptions> GrpcListenerOptionsFromFlags();

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_FLAGS_H_
