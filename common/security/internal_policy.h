// Who may call what on the internal control plane: one table for every internal gRPC server
// (the router's internal port, workers' WorkerService + KvTransferService). A method is named by
// its gRPC path "/package.Service/Method"; the most specific entry (a method before its service)
// decides; a method in no entry is refused (default deny).
//
//   /tandem.v1.WorkerRegistry/*           prefill, decode, mixed      (register, heartbeat)
//   /tandem.v1.Router/ListWorkers         admin                        (internal port's admin call)
//   /tandem.v1.WorkerService/Stats        router, admin                (tandem_cli stats)
//   /tandem.v1.WorkerService/Health       router, admin
//   /tandem.v1.WorkerService/*            router                       (Prefill, Decode, Generate,
//   Abort) /tandem.v1.KvTransferService/*        prefill, decode, mixed       (handshake, lease
//   release/renew)
//
// Thread safety: pure functions over a constant table.
#ifndef TANDEM_COMMON_SECURITY_INTERNAL_POLICY_H_
#define TANDEM_COMMON_SECURITY_INTERNAL_POLICY_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/security/roles.h"

namespace tandem::security {

// The roles allowed to call `method`; empty for a method the table does not know.
RoleSet AllowedRoles(absl::string_view method);

// OK, or PERMISSION_DENIED (generic message; the method and role are logged at VLOG 1).
absl::Status AuthorizeInternalCall(absl::string_view method, const PeerIdentity& peer);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_INTERNAL_POLICY_H_
