// GrpcListenerOptions: the bounds of a daemon's gRPC port (GrpcListener, grpc_listener.h), in a
// header of their own without gRPC, so that daemon configs (WorkerConfig, RouterOptions) and
// their flags can hold them.
#ifndef TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_
#define TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_

#include <cstdint>

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
  // The server pings a connection after keepalive_time without one and closes it when the ack
  // takes longer than keepalive_timeout (also its sockets' TCP_USER_TIMEOUT, gRPC's server
  // default of 20 s): a peer gone without a FIN (a dropped link, a dead host, replies
  // black-holed) frees its connection and the calls on it, a router's streams and the worker
  // calls behind them, in at most ~40 s instead of at their deadlines (gRPC's default: pings
  // every 2 hours). The ack is the peer's transport's, never its handlers'.
  absl::Duration keepalive_time = absl::Seconds(20);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): more wait in
  // the client until one ends. With gRPC's flow-control windows per stream this bounds what one
  // connection can make the server buffer (gRPC's default: no bound). Above the requests a
  // router holds (--max_queue, 1024) and a worker admits (--max_num_seqs + --max_queued_requests,
  // 4352): the router multiplexes every request to a worker over one connection.
  int max_concurrent_streams = 8192;
  // Memory of all the port's connections together (a grpc::ResourceQuota): near it gRPC shrinks
  // the flow-control windows, and at it closes idle connections and cancels streams
  // (RESOURCE_EXHAUSTED) rather than grow (gRPC's default: no bound).
  int64_t memory_quota_bytes = int64_t{4} << 30;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_LISTENER_OPTIONS_H_
