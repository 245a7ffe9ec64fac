// Real packet drops between the router and a worker, for fault tests and probes
// (router/grpc/partition_test, router/grpc/link_drop_probe): on the loopback of a network
// namespace of the process's own, so the host's interfaces are never touched.
//
// The drop is tc's, as tests/reliability/fault_probe.py does it: an htb qdisc on lo whose class
// 1:2 feeds a bfifo that holds 0 bytes, and u32 filters sending a TCP port's packets there. A
// loopback packet passes lo's egress once, so a filter on the destination port black-holes one
// direction of the connections to that port (requests, SYNs), one on the source port the other
// (replies, SYN-ACKs): a one-way partition.
//
// Thread safety: EnterDroppingNetworkNamespace only while the process has one thread (first thing
// in main: a thread keeps the namespace it was started in); the rest from any one thread at a time.
#ifndef TANDEM_ROUTER_TESTING_LINK_DROP_H_
#define TANDEM_ROUTER_TESTING_LINK_DROP_H_

#include "absl/status/status.h"

namespace tandem::router {

// Moves the process into a new network namespace with its loopback up and the dropping class in
// place. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip` and `tc`;
// FAILED_PRECONDITION naming what failed otherwise.
absl::Status EnterDroppingNetworkNamespace();

enum class DropDirection {
  kToPort,    // packets whose destination is the port: calls to the server on it
  kFromPort,  // packets from the port: its replies
  kBoth,
};

// Drops the loopback's TCP packets to and/or from `port` from now on (after
// EnterDroppingNetworkNamespace).
absl::Status DropPackets(int port, DropDirection direction);
// Removes every drop DropPackets added.
absl::Status StopDropping();

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TESTING_LINK_DROP_H_
