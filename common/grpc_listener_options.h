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
  // Not shorter: a gRPC client that reconnects in the background (its calls fail fast, none
  // waits for the channel) advances the connection only at the 5 s ticks of gRPC's backup
  // poller, so connect + TLS + preface can take 10-15 s; at 10 s such a client never got back
  // to a restarted worker (tp_serving_e2e_test, KillDecodeRankOneMidStream...).
  absl::Duration handshake_timeout = absl::Seconds(30);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_
