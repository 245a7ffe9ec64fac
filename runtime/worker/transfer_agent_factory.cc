#include "runtime/worker/transfer_agent_factory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/ucx_agent.h"

namespace tandem::runtime {

absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> MakeTransferAgent(
    const TransferAgentFlags& flags) {
  if (flags.transport == "ucx") {
    kvtransfer::UcxAgentOptions options;
    options.transports = flags.ucx_tls;
    options.net_device = flags.ucx_net_device;
    options.stage_cuda_memory = flags.stage_cuda_memory;
    absl::StatusOr<std::unique_ptr<kvtransfer::UcxAgent>> agent =
        kvtransfer::UcxAgent::Create(std::move(options));
    if (!agent.ok()) return agent.status();
    return std::unique_ptr<kvtransfer::TransferAgent>(std::move(*agent));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_transport must be ucx, got '", flags.transport, "'"));
}

}  // namespace tandem::runtime
