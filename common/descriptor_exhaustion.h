// Test helper: this process out of file descriptors for a moment, so that a server in it sees
// accept() fail with EMFILE (common/grpc_listener_test, common/http/http_server_test).
#ifndef TANDEM_COMMON_DESCRIPTOR_EXHAUSTION_H_
#define TANDEM_COMMON_DESCRIPTOR_EXHAUSTION_H_

#include "absl/time/time.h"

namespace tandem {

// Lowers the soft RLIMIT_NOFILE just past what is open, fills the rest with /dev/null, connects
// a TCP socket to 127.0.0.1:`port` (connect needs no new descriptor; the server's accept does,
// and fails), holds that for `hold`, then frees the descriptors and restores the limit. Returns
// the connected socket (the caller closes it), or -1 when a step failed.
int ConnectWhileOutOfDescriptors(int port, absl::Duration hold);

}  // namespace tandem

#endif  // TANDEM_COMMON_DESCRIPTOR_EXHAUSTION_H_
