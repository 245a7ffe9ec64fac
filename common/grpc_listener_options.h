// GrpcListenerOptions: the bounds of a daemon's gRPC port (GrpcListener, grpc_listener.h), in a
// header of their own without gRPC, so that daemon configs (WorkerConfig, RouterOptions) and
// their flags can hold them.
#ifndef TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_
#define TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_

#include "absl/time/time.h"

namespace tandem {

struct GrpcListenerOptions {
  // Open connections at most; more are closed as soon as accepted. Clamped to a quarter of the
  // process's descriptor limit (WithinAQuarterOfTheOpenFileLimit). The router and the workers
  // each hold one connection to a peer's port, a client or a tool one or a few.
  int max_connections = 4096;
  // A connection whose TLS handshake and HTTP/2 SETTINGS are not done within this is dropped.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_
