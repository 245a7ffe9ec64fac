// Roles of Tandem's peers and how a certificate names one.
//
// Every certificate the cluster CA issues (deploy/certs/make_certs.sh) carries its holder's role
// as a URI SAN `spiffe://tandem/role/<role>` and, redundantly, as the subject's OU. The URI is
// authoritative: IdentityFromCertificatePem reads the role from it, falls back to the OU only
// when the certificate has no role URI at all, and refuses a certificate whose role URIs (or URI
// and OU) disagree. The certificate's CN names the peer (e.g. "prefill-0"); it scopes what the
// peer owns (request ids, aborts), the role says what it may call.
//
// A worker daemon's certificate also names the ONE worker it belongs to, in the same URI:
// `spiffe://tandem/role/<role>/worker/<worker_id>` (make_certs.sh --worker=ID:ROLE). The role
// checks read the role part as before; the worker id is what per-daemon checks compare (a KV
// lease bound to a decode worker: kvtransfer/kv_transfer_service.h; a registration under its
// own id only: router/core/worker_registry.h). A certificate naming two different worker ids is
// refused. Worker ids are 1..kMaxWorkerIdBytes bytes of [A-Za-z0-9._-].
//
// Thread safety: pure functions and values.
#ifndef TANDEM_COMMON_SECURITY_ROLES_H_
#define TANDEM_COMMON_SECURITY_ROLES_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::security {

enum class Role : uint8_t {
  kRouter = 0,  // the router: calls workers' WorkerService
  kPrefill,     // workers: register with the router, call each other's KvTransferService
  kDecode,
  kMixed,
  kAdmin,   // operators and tandem_cli: ListWorkers, worker Stats/Health
  kClient,  // a public client presenting a certificate (public port with a client CA)
};

inline constexpr absl::string_view kRoleUriPrefix = "spiffe://tandem/role/";
// Between the role and the worker id in a per-daemon URI.
inline constexpr absl::string_view kWorkerUriInfix = "/worker/";
inline constexpr size_t kMaxWorkerIdBytes = 128;  // tandem::v1::kMaxIdBytes

// The URI SAN naming `role` (and `worker_id` when not empty).
std::string IdentityUri(Role role, absl::string_view worker_id = "");
// Whether `id` can appear in an identity URI (see the header comment).
bool IsValidWorkerId(absl::string_view id);

absl::string_view RoleName(Role role);
// "router", "prefill", "decode", "mixed", "admin", "client"; nullopt otherwise.
std::optional<Role> ParseRole(absl::string_view name);
bool IsWorkerRole(Role role);

// A small set of roles (a bitmask).
class RoleSet {
 public:
  constexpr RoleSet() = default;
  constexpr RoleSet(std::initializer_list<Role> roles) {
    for (Role r : roles) bits_ |= Bit(r);
  }
  static constexpr RoleSet Workers() { return {Role::kPrefill, Role::kDecode, Role::kMixed}; }
  constexpr bool Contains(Role role) const { return (bits_ & Bit(role)) != 0; }
  constexpr RoleSet Union(RoleSet other) const {
    RoleSet s;
    s.bits_ = bits_ | other.bits_;
    return s;
  }
  std::string ToString() const;  // "router|admin"

 private:
  static constexpr uint32_t Bit(Role r) { return uint32_t{1} << static_cast<uint32_t>(r); }
  uint32_t bits_ = 0;
};

// Who is on the other end of an authenticated connection.
struct PeerIdentity {
  Role role = Role::kClient;
  std::string name;              // the certificate's CN (may be empty)
  std::string worker_id;         // from a per-daemon URI; empty for a role-only certificate
  std::string ToString() const;  // "prefill:prefill-0", "decode:decode-1/worker/decode-1"
};

// The identity a PEM certificate (the leaf) asserts. Checks nothing about who signed it: call it
// only on certificates the TLS handshake already verified against the CA. INVALID_ARGUMENT for
// an unparseable certificate; PERMISSION_DENIED when it names no role or conflicting roles.
absl::StatusOr<PeerIdentity> IdentityFromCertificatePem(absl::string_view pem);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_ROLES_H_
