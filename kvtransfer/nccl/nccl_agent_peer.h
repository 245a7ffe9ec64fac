// Two-process harness for NcclAgent's GPU test and benchmark (CUDA builds only). NCCL refuses
// one device twice in a communicator, so the source agent runs in a child process: the binary
// re-executes itself (/proc/self/exe) with TANDEM_NCCL_PEER set, and its main() calls
// MaybeRunPeer() first.
//
// The child: cudaSetDevice(device), allocates `bytes` of device memory filled with
// FillPattern(seed), registers it with an NcclAgent (region 0; staging_chunk_bytes as given,
// 0 = the default), writes its descriptor to the parent, then serves reads until the parent
// closes its pipe. It also answers raw-NCCL benchmark commands (RawSend) on a separate
// communicator, and RestartAgent (the benchmark gives the source each configuration it sweeps).
//
// Thread safety: a PeerProcess is used by one thread.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_PEER_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer::nccl_peer {

// Deterministic bytes: out[i] = pattern byte at absolute offset `offset + i` for `seed`.
void FillPattern(uint64_t seed, uint64_t offset, uint64_t n, char* out);

// Runs the child role when TANDEM_NCCL_PEER is set and returns its exit code; -1 otherwise.
int MaybeRunPeer();

// Source agent settings RestartAgent applies; 0 (-1 for copy_mode) keeps NcclAgentOptions'
// default.
struct PeerAgentConfig {
  uint64_t staging_chunk_bytes = 0;
  int copy_ctas = 0;
  int staging_buffers = 0;
  int copy_mode = -1;  // a nccl_copy::CopyMode
};

enum class PeerMode {
  kAgent,  // a real NcclAgent serves the reads (see above)
  // A hand-played source (no agent): joins the reader's communicator, sends the warm-up byte,
  // acks the first kRead with OK and then sends nothing, alive, until the parent's pipe closes.
  // The reader's receive waits for bytes that never come.
  kStallAfterAck,
};

class PeerProcess {
 public:
  static absl::StatusOr<PeerProcess> Spawn(int device, uint64_t bytes, uint64_t seed,
                                           uint64_t staging_chunk_bytes = 0,
                                           PeerMode mode = PeerMode::kAgent);
  PeerProcess(PeerProcess&& other) noexcept;
  PeerProcess& operator=(PeerProcess&&) = delete;
  ~PeerProcess();  // closes the pipe, resumes a stopped child and waits for it

  const tandem::v1::TransferHandshake& descriptor() const { return descriptor_; }
  void Kill();  // SIGKILL and reap
  // SIGSTOP / SIGCONT: a peer that is alive (its sockets stay open) but makes no progress.
  void Stop();
  void Continue();
  // Raw baseline: the child joins a fresh 2-rank communicator (`unique_id`, rank 1) on first
  // use, then ncclSends `bytes` from the start of its buffer `iters` times; returns once it has
  // posted the command (the parent receives with ncclRecv on rank 0).
  absl::Status RawInit(const std::string& unique_id);
  absl::Status RawSend(uint64_t bytes, uint32_t iters);
  absl::Status WaitRawDone();
  // PeerMode::kAgent only: replaces the child's agent by a fresh one with `config` over the same
  // memory (its readers' connections end) and updates descriptor(). Connect readers anew.
  absl::Status RestartAgent(const PeerAgentConfig& config);

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  tandem::v1::TransferHandshake descriptor_;
};

}  // namespace tandem::kvtransfer::nccl_peer

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_PEER_H_
