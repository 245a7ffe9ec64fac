#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Calls fn(name, ipv4 string, flags) for every IPv4 interface address; stops when it returns
// true.
template <typename Fn>
bool ForEachIpv4(Fn fn) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (ifaddrs* a = all; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    found = fn(std::string(a->ifa_name), std::string(text), a->ifa_flags);
  }
  freeifaddrs(all);
  return found;
}

}  // namespace

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::StatusOr<std::string> InterfaceForAddress(const std::string& ip) {
  std::string name;
  if (ForEachIpv4([&](const std::string& iface, const std::string& addr, unsigned) {
        if (addr != ip) return false;
        name = iface;
        return true;
      })) {
    return name;
  }
  return absl::NotFoundError(absl::StrCat("no interface of this host has address ", ip));
}

absl::StatusOr<std::string> FirstNonLoopbackAddress() {
  std::string found;
  if (ForEachIpv4([&](const std::string&, const std::string& addr, unsigned flags) {
        if ((flags & IFF_UP) == 0 || (flags & IFF_LOOPBACK) != 0) return false;
        found = addr;
        return true;
      })) {
    return found;
  }
  return absl::NotFoundError("this host has no non-loopback IPv4 address that is up");
}

}  // namespace tandem
