// Builds the worker's TransferAgent from its flags (--kv_transport, the UCX and NCCL options).
#ifndef TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_
#define TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/security_config.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::runtime {

struct TransferAgentFlags {
  // "ucx" (host or staged device memory, any two processes) or "nccl" (device memory, GPU
  // peers on one fabric; CUDA builds with --backend=cuda only).
  std::string transport = "ucx";
  std::string ucx_tls = "tcp,self,sm";
  std::string ucx_net_device = "lo";
  // The KV pool is device memory (CUDA backend) on `device`. UCX without CUDA transports then
  // stages it through host memory (the worker syncs held blocks before publishing them); NCCL
  // moves it device to device and needs it.
  bool cuda_pool = false;
  int device = 0;
  // UCX with a CUDA pool: the pool's host mirror is page-locked in granules of this many bytes
  // as reads first need them (kvtransfer::UcxAgentOptions::cuda_mirror_pin_granule_bytes; 0: the
  // whole mirror at start). Unset: the agent's default.
  std::optional<uint64_t> ucx_mirror_pin_granule_bytes;
  // The NCCL agent's control socket binds here (port chosen by the kernel); peers learn the
  // address from the handshake.
  std::string nccl_control_host = "127.0.0.1";
  // Authenticates the NCCL control socket (kvtransfer/nccl/nccl_agent_auth.h): the worker's
  // secret derived from its TLS key (NcclControlTokenKey). Empty (--insecure): unauthenticated,
  // bound to nccl_control_host only.
  std::string nccl_token_key;
  // Where the network interfaces UCX may use are listed (UCX itself looks there): a device in
  // ucx_net_device that is missing makes startup fail instead of every KV load later.
  std::string sysfs_net_dir = "/sys/class/net";
};

// INVALID_ARGUMENT for an unknown transport, "nccl" without a CUDA pool, or a UCX network device
// UCX cannot see (named, with what it can see: e.g. a container that mounts the host's /sys);
// UNIMPLEMENTED for "nccl" in a build without CUDA; the agent's own errors otherwise (no GPU).
absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> MakeTransferAgent(
    const TransferAgentFlags& flags);

// The key NCCL control tokens are MACed with: derived from this process's TLS private key, so
// every rank of a worker group (one certificate) has the same; empty when insecure.
std::string NcclControlTokenKey(const security::SecurityConfig& security);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_TRANSFER_AGENT_FACTORY_H_
