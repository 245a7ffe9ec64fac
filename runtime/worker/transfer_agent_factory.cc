#include "runtime/worker/transfer_agent_factory.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> MakeTransferAgent(
    const TransferAgentFlags& flags) {
  if (flags.transport == "ucx") {
    kvtransfer::UcxAgentOptions options;
    options.transports = flags.ucx_tls;
    options.net_device = flags.ucx_net_device;
    options.stage_cuda_memory = flags.cuda_pool;
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
    return Upcast(kvtransfer::NcclAgent::Create(std::move(options)));
#else
    return absl::UnimplementedError("--kv_transport=nccl: this build has no CUDA");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_transport must be ucx or nccl, got '", flags.transport, "'"));
}

}  // namespace tandem::runtime
