#include "common/grpc_keepalive.h"

namespace tandem {
namespace {

int Ms(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

void EnableKeepalive(grpc::ChannelArguments& args, absl::Duration time, absl::Duration timeout) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(timeout));
  // Idle channels too: a router learns a worker's link is gone before it routes a request there.
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Without these, gRPC stops pinging after 2 pings with no data frame sent, and spaces pings
  // without data 5 minutes apart: keepalive would go quiet exactly on a quiet stream.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, Ms(time));
}

void AllowKeepalivePings(grpc::ServerBuilder& builder, absl::Duration min_interval) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Ms(min_interval));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // 0: unlimited
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace tandem
