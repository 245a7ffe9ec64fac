#include "router/testing/link_drop.h"

#include <sched.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::router {
namespace {

absl::Status Sh(const std::string& cmd) {
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("failed: ", cmd));
}

}  // namespace

absl::Status EnterDroppingNetworkNamespace() {
  if (unshare(CLONE_NEWNET) != 0) {
    return absl::FailedPreconditionError("unshare(CLONE_NEWNET) failed (not root?)");
  }
  for (const char* cmd : {"ip link set lo up", "tc qdisc add dev lo root handle 1: htb default 1",
                          "tc class add dev lo parent 1: classid 1:1 htb rate 1000mbit",
                          "tc class add dev lo parent 1: classid 1:2 htb rate 8bit",
                          "tc qdisc add dev lo parent 1:2 handle 20: bfifo limit 0"}) {
    if (absl::Status s = Sh(cmd); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DropPackets(int port, DropDirection direction) {
  for (const char* field : {"dport", "sport"}) {
    const bool to = std::string(field) == "dport";
    if ((to && direction == DropDirection::kFromPort) ||
        (!to && direction == DropDirection::kToPort)) {
      continue;
    }
    if (absl::Status s = Sh(absl::StrCat("tc filter add dev lo parent 1: protocol ip prio 1 u32 ",
                                         "match ip ", field, " ", port, " 0xffff flowid 1:2"));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StopDropping() { return Sh("tc filter del dev lo parent 1: prio 1"); }

}  // namespace tandem::router
