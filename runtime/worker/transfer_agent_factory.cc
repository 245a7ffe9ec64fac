#include "runtime/worker/transfer_agent_factory.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/ucx/ucx_agent.h"
#if defined(TANDEM_WITH_CUDA)
#include "kvtransfer/nccl/nccl_agent.h"
#endif

namespace tandem::runtime {
namespace {

template <typename Agent>
absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> Upcast(
    absl::StatusOr<std::unique_ptr<Agent>> agent) {
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<kvtransfer::TransferAgent>(std::move(*agent));
}

// Every TCP-style entry of a UCX device list ("all", and RDMA "dev:port" entries aside) must be
// an interface UCX can see, else it silently drops it and every KV read fails unreachable.
absl::Status CheckNetDevices(const std::string& devices, const std::string& sysfs_net_dir) {
  for (absl::string_view d : absl::StrSplit(devices, ',', absl::SkipEmpty())) {
    if (d == "all" || d.find(':') != absl::string_view::npos) continue;
    if (std::filesystem::exists(std::filesystem::path(sysfs_net_dir) / std::string(d))) continue;
    std::vector<std::string> seen;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(sysfs_net_dir, ec)) {
      seen.push_back(entry.path().filename().string());
    }
    std::sort(seen.begin(), seen.end());
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX network device '", d, "' is not in ", sysfs_net_dir,
        " (it lists: ", seen.empty() ? "nothing" : absl::StrJoin(seen, ", "),
        "); every KV transfer would fail. Set --ucx_net_device to one of those, or run where "
        "this network namespace's /sys is mounted"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> MakeTransferAgent(
    const TransferAgentFlags& flags) {
  if (flags.transport == "ucx") {
    if (absl::Status s = CheckNetDevices(flags.ucx_net_device, flags.sysfs_net_dir); !s.ok()) {
      return s;
    }
    kvtransfer::UcxAgentOptions options;
    options.transports = flags.ucx_tls;
    options.net_device = flags.ucx_net_device;
    options.stage_cuda_memory = flags.cuda_pool;
    if (flags.ucx_mirror_pin_granule_bytes.has_value()) {
      options.cuda_mirror_pin_granule_bytes = *flags.ucx_mirror_pin_granule_bytes;
    }
    return Upcast(kvtransfer::UcxAgent::Create(std::move(options)));
  }
  if (flags.transport == "nccl") {
    if (!flags.cuda_pool) {
      return absl::InvalidArgumentError(
          "--kv_transport=nccl moves device memory: it needs --backend=cuda");
    }
#if defined(TANDEM_WITH_CUDA)
    kvtransfer::NcclAgentOptions options;
    options.device = flags.device;
    options.control_host = flags.nccl_control_host;
    options.control_token_key = flags.nccl_token_key;
    return Upcast(kvtransfer::NcclAgent::Create(std::move(options)));
#else
    return absl::UnimplementedError("--kv_transport=nccl: this build has no CUDA");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_transport must be ucx or nccl, got '", flags.transport, "'"));
}

std::string NcclControlTokenKey(const security::SecurityConfig& security) {
  return security::DeriveSecret(security, "tandem nccl control token key v1");
}

}  // namespace tandem::runtime
