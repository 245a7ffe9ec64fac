// Builds the worker's TransferAgent from its flags (--kv_transport and the UCX options).
#ifndef TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_
#define TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::runtime {

struct TransferAgentFlags {
  std::string transport = "ucx";
  std::string ucx_tls = "tcp,self,sm";
  std::string ucx_net_device = "lo";
  // The KV pool is device memory (CUDA backend): UCX without CUDA transports stages it through
  // host memory (the worker then syncs held blocks before publishing them).
  bool stage_cuda_memory = false;
};

// INVALID_ARGUMENT for an unknown transport; the agent's own errors otherwise.
absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> MakeTransferAgent(
    const TransferAgentFlags& flags);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_
