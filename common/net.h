// Host network facts a daemon needs to bind and advertise the right interface (a worker that
// listens on every interface must still tell its peers an address they can reach, and its KV
// transport must use the interface of that address, not loopback).
//
// Thread safety: pure functions (they read the host's interfaces).
#ifndef TANDEM_COMMON_NET_H_
#define TANDEM_COMMON_NET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// "0.0.0.0", "::", "[::]" or empty: listening on every interface.
bool IsWildcardHost(absl::string_view host);

// The name of the interface that holds IPv4 address `ip` (e.g. "lo" for 127.0.0.1); NOT_FOUND
// when none does (or `ip` is not an IPv4 literal).
absl::StatusOr<std::string> InterfaceForAddress(const std::string& ip);

// The first IPv4 address of an interface that is up and not loopback; NOT_FOUND when there is
// none.
absl::StatusOr<std::string> FirstNonLoopbackAddress();

}  // namespace tandem

#endif  // TANDEM_COMMON_NET_H_
