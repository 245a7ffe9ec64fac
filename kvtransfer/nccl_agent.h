// NcclAgent: the TransferAgent over NCCL point-to-point (ncclSend/ncclRecv) between GPUs on one
// fabric (NVLink / IB, whatever NCCL picks), with its own TCP bootstrap. CUDA builds only.
//
// NCCL p2p is two-sided, so a READ needs the source's cooperation:
//  * Every agent listens on a TCP control socket (options.control_host, port 0 = any); its
//    "host:port" is the worker_address of FillLocalDescriptor. Regions carry base/length/kind.
//  * AddPeer(name, desc) connects to the peer's control socket and makes a 2-rank communicator
//    for this direction only (this reader = rank 0, generates the ncclUniqueId and sends it in a
//    kHello frame; the source's accept loop answers with rank 1). Each side initialises and
//    drives the communicator on its own dedicated thread with its own CUDA stream. A pair that
//    reads both ways therefore has two independent communicators (no "who is lower" election).
//  * PostRead validates and coalesces the ops and queues the transfer on the peer's thread,
//    which runs one transfer at a time: it sends the op list (kRead, nccl_agent_wire.h); the
//    source validates it against its own regions and answers kReadAck; on OK both post one
//    ncclSend / ncclRecv per coalesced op inside ncclGroupStart/End, and the reader records a
//    cudaEvent that its thread polls. A refused list ends the transfer with the source's error.
//
// Cancel: a transfer still queued ends CANCELLED at once. Posted NCCL ops cannot be cancelled:
// once its kRead was sent the transfer ends CANCELLED only after the bytes have arrived.
// Failure: EOF or an error on the control socket (peer died), or an NCCL error, ncclCommAbort()s
// the communicator, waits for the stream, and ends every transfer of that peer UNAVAILABLE; the
// name stays known and PostRead to it fails UNAVAILABLE until AddPeer reconnects. RemovePeer and
// re-AddPeer end the old connection's transfers CANCELLED (after the same abort).
// Limits: ncclCommInitRank is blocking (NCCL's own bootstrap timeouts apply); AddPeer waits for it.
//
// Thread safety: all methods are thread-safe. Threads: one accept loop, one per outgoing peer,
// one per incoming (served) connection. ~NcclAgent aborts all communicators and joins them:
// nothing is written into registered memory after it returns.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

struct NcclAgentOptions {
  // CUDA device this agent's memory lives on; all its NCCL work runs there.
  int device = 0;
  // Control listener address. Port 0 picks a free port.
  std::string control_host = "127.0.0.1";
  int control_port = 0;
  // TCP connect to a peer's control socket gives up after this long.
  absl::Duration connect_timeout = absl::Seconds(5);
};

class NcclAgent final : public TransferAgent {
 public:
  static absl::StatusOr<std::unique_ptr<NcclAgent>> Create(NcclAgentOptions options = {});
  ~NcclAgent() override;
  NcclAgent(const NcclAgent&) = delete;
  NcclAgent& operator=(const NcclAgent&) = delete;

  std::string transport() const override { return "nccl"; }
  // MEMORY_KIND_CUDA only (device memory of options.device); others are INVALID_ARGUMENT.
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override;
  absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) override;
  // Blocks until the communicator is up. UNAVAILABLE when the peer cannot be reached.
  absl::Status AddPeer(const std::string& peer_name,
                       const tandem::v1::TransferHandshake& peer) override;
  void RemovePeer(const std::string& peer_name) override;
  absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                      absl::Span<const CopyOp> ops) override;
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  TransferAgentStats Stats() const override;

  // "host:port" of the control listener.
  std::string control_address() const { return address_; }

 private:
  struct Region {
    char* base;
    uint64_t length;
  };
  struct Transfer;
  struct Peer;
  struct Served;

  explicit NcclAgent(NcclAgentOptions options);  // out of line: members hold incomplete types
  absl::Status Init();
  void AcceptLoop();
  void PeerLoop(Peer* peer);
  void ServeLoop(Served* served);
  // Reader side of one transfer: kRead, ack, ncclRecv group, wait for the event.
  // Returns the connection's status; *result gets the transfer's (the source may refuse it).
  absl::Status RunTransfer(Peer* peer, Transfer* t, void* comm_state, int fd, absl::Status* result);
  void EndLocked(Transfer* t, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops `peer`'s thread and joins it (mu_ must not be held).
  static void StopPeer(Peer* peer);

  const NcclAgentOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the accept loop on destruction
  std::string address_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Served>> served_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferId, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_H_
