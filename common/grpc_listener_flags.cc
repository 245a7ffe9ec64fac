#include "common/grpc_listener_flags.h"

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(int32_t, grpc_max_connections, tandem::GrpcListenerOptions{}.max_connections,
          "open connections per gRPC port at most (more are closed at once; also at most a "
          "quarter of the descriptor limit)");
ABSL_FLAG(int64_t, grpc_handshake_timeout_ms,
          absl::ToInt64Milliseconds(tandem::GrpcListenerOptions{}.handshake_timeout),
          "a gRPC connection whose TLS handshake and HTTP/2 preface are not done by then is "
          "dropped");
ABSL_FLAG(int32_t, grpc_max_concurrent_streams,
          tandem::GrpcListenerOptions{}.max_concurrent_streams,
          "calls open at once on one gRPC connection (more wait in the client)");
ABSL_FLAG(int64_t, grpc_memory_quota_mb, tandem::GrpcListenerOptions{}.memory_quota_bytes >> 20,
          "memory of a gRPC port's connections together (gRPC ResourceQuota; past it, streams "
          "are cancelled RESOURCE_EXHAUSTED)");

namespace tandem {

absl::StatusOr<GrpcListenerOptions> GrpcListenerOptionsFromFlags() {
  GrpcListenerOptions o;
  o.max_connections = absl::GetFlag(FLAGS_grpc_max_connections);
  o.handshake_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_grpc_handshake_timeout_ms));
  o.max_concurrent_streams = absl::GetFlag(FLAGS_grpc_max_concurrent_streams);
  const int64_t quota_mb = absl::GetFlag(FLAGS_grpc_memory_quota_mb);
  if (o.max_connections < 1 || o.handshake_timeout <= absl::ZeroDuration() ||
      o.max_concurrent_streams < 1 || quota_mb < 1 || quota_mb > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        "--grpc_max_connections, --grpc_handshake_timeout_ms, --grpc_max_concurrent_streams and "
        "--grpc_memory_quota_mb must be >= 1 (the quota at most 2^40 MiB)");
  }
  o.memory_quota_bytes = quota_mb << 20;
  return o;
}

}  // namespace tandem
