#include "common/security/internal_policy.h"

#include <array>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security/auth_status.h"

namespace tandem::security {
namespace {

// A path ending in '/' covers the whole service; exact methods are listed before their service.
constexpr RoleSet kWorkers = RoleSet::Workers();
const std::array<std::pair<absl::string_view, RoleSet>, 6> kPolicy = {{
    {"/tandem.v1.WorkerRegistry/", kWorkers},
    {"/tandem.v1.Router/ListWorkers", {Role::kAdmin}},
    {"/tandem.v1.WorkerService/Stats", {Role::kRouter, Role::kAdmin}},
    {"/tandem.v1.WorkerService/Health", {Role::kRouter, Role::kAdmin}},
    {"/tandem.v1.WorkerService/", {Role::kRouter}},
    {"/tandem.v1.KvTransferService/", kWorkers},
}};

}  // namespace

RoleSet AllowedRoles(absl::string_view method) {
  for (const auto& [path, roles] : kPolicy) {
    const bool service_wide = path.back() == '/';
    if (service_wide ? absl::StartsWith(method, path) && method.size() > path.size()
                     : method == path) {
      return roles;
    }
  }
  return {};
}

absl::Status AuthorizeInternalCall(absl::string_view method, const PeerIdentity& peer) {
  const RoleSet allowed = AllowedRoles(method);
  if (allowed.Contains(peer.role)) return absl::OkStatus();
  return PermissionDenied(absl::StrCat(peer.ToString(), " may not call ", method,
                                       " (allowed: ", allowed.ToString(), ")"));
}

}  // namespace tandem::security
