// gRPC keepalive for the internal plane's long-lived channels (router -> workers' WorkerService,
// workers -> router's WorkerRegistry): a link that goes silent is detected by the transport in
// kKeepaliveTime + kKeepaliveTimeout (~1-2 s), failing the calls open on it with UNAVAILABLE,
// instead of only by the router's heartbeat timeout (--worker_timeout_ms, 5 s).
//
// Both ends must agree: a client pinging more often than its server allows (gRPC's server
// default: once per 5 minutes without data, 2 strikes) is sent GOAWAY "too_many_pings", which
// tears down the connection and the calls on it. So every server such a channel talks to calls
// AllowKeepalivePings, and every such channel calls EnableKeepalive.
//
// Thread safety: both functions only write to the object they are given.
#ifndef TANDEM_COMMON_GRPC_KEEPALIVE_H_
#define TANDEM_COMMON_GRPC_KEEPALIVE_H_

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace tandem {

// A ping after this long without one, and the connection is dead when its ack takes longer than
// kKeepaliveTimeout. A second is far above a loaded host's scheduling delay for gRPC's I/O
// thread (acks do not wait for handlers or engine steps).
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(1);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(1);

// Client side: ping every `time` (also without calls in flight), give up after `timeout`.
void EnableKeepalive(grpc::ChannelArguments& args, absl::Duration time = kKeepaliveTime,
                     absl::Duration timeout = kKeepaliveTimeout);

// Server side: accept pings as often as every `min_interval` (no strikes, with or without calls),
// so clients of EnableKeepalive are never sent GOAWAY "too_many_pings".
void AllowKeepalivePings(grpc::ServerBuilder& builder,
                         absl::Duration min_interval = kKeepaliveTime / 2);

}  // namespace tandem

#endif  // TANDEM_COMMON_GRPC_KEEPALIVE_H_
