// NcclAgent: the TransferAgent over NCCL point-to-point (ncclSend/ncclRecv) between GPUs on one
// fabric (NVLink / IB, whatever NCCL picks), with its own TCP bootstrap. CUDA builds only.
//
// NCCL p2p is two-sided, so a READ needs the source's cooperation:
//  * Every agent listens on a TCP control socket (options.control_host, port 0 = any); its
//    "host:port" is the worker_address of FillLocalDescriptor. Regions carry base/length/kind.
//  * AddPeer(name, desc) connects to the peer's control socket and makes options.num_comms
//    2-rank communicators for this direction only (this reader = rank 0, generates their
//    ncclUniqueIds and sends them in a kHello frame; the source's accept loop joins as rank 1).
//    The source opens with a challenge; the hello answers it with a proof of desc.access_token:
//    with options.control_token_key set, the source accepts a connection only with a live token
//    it issued (IssueAccessToken, handed out by its KvTransferService to authenticated readers)
//    and closes it otherwise, before NCCL runs (nccl_agent_auth.h).
//    Both sides join with NCCL's non-blocking init and a deadline (NcclLink, nccl_agent_link.h): a
//    peer that never joins fails AddPeer with DEADLINE_EXCEEDED after options.init_timeout, one
//    that hangs up with UNAVAILABLE. Each side drives the communicators on its own thread with its
//    own streams. A pair that reads both ways therefore has two independent sets of communicators.
//  * PostRead (and PostStridedRead: rows of a KV head slice with gaps on either side, the
//    re-shard between TP splits, gathered / scattered by the same copies) validates and
//    coalesces the ops and queues the transfer on the peer's thread. Up
//    to max_posted_transfers transfers are out at once: the thread sends each one's op list
//    (kRead, nccl_agent_wire.h) without waiting for earlier ones; the source validates it against
//    its own regions and acks (kReadAck), and on OK both sides put the transfer's NCCL messages
//    (nccl_agent_plan.h: packed chunks of staging_chunk_bytes, ops >= direct_min_bytes on their
//    own, a run of those as one NCCL group) on the GPU behind the earlier ones. The source gathers
//    scattered ranges into a staging ring with a copy kernel, the reader scatters them out of its
//    own ring; a message that is contiguous on one side skips that side's copy. A transfer ends
//    when its last scatter ran. A refused list ends the transfer with the source's error.
//
// Cancel: a transfer still queued ends CANCELLED at once. Posted NCCL ops cannot be cancelled:
// once its kRead was sent the transfer ends CANCELLED only after the bytes have arrived.
// Failure: EOF or an error on the control socket (peer died), an NCCL error, or a transfer that
// makes no progress for options.transfer_timeout (a silent peer: no ack, or the oldest posted
// transfer not finished) ncclCommAbort()s the communicators, waits for the streams, and ends
// every transfer of that peer UNAVAILABLE; the name stays known and PostRead to it fails
// UNAVAILABLE until AddPeer reconnects. RemovePeer and re-AddPeer end the old connection's
// transfers CANCELLED (after the same abort). The source side applies the same init and
// transfer deadlines to each reader it serves, so a silent reader cannot pin its thread.
// Memory: per connection and side, staging_buffers * staging_chunk_bytes of device memory
// (384 MiB by default).
//
// Thread safety: all methods are thread-safe. Threads: one accept loop, one per outgoing peer,
// one per incoming (served) connection. ~NcclAgent aborts all communicators and joins them:
// nothing is written into registered memory after it returns.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_H_

#include <cstdint>
#include <deque>
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
#include "kvtransfer/nccl/nccl_agent_auth.h"
#include "kvtransfer/nccl/nccl_agent_copy.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"
#include "kvtransfer/transfer_agent.h"
#include "kvtransfer/transfer_table.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

class NcclLink;

struct NcclAgentOptions {
  // CUDA device this agent's memory lives on; all its NCCL work runs there.
  int device = 0;
  // Control listener address. Port 0 picks a free port.
  std::string control_host = "127.0.0.1";
  int control_port = 0;
  // Authenticates the control socket (nccl_agent_auth.h): tokens are derived with this key (the
  // worker derives it from its TLS key, so every rank of a group shares it) and open
  // connections for control_token_lifetime. Empty: no token is issued or checked (--insecure
  // workers, tests).
  std::string control_token_key;
  absl::Duration control_token_lifetime = absl::Seconds(60);
  // TCP connect to a peer's control socket gives up after this long.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Joining a pair's communicator (AddPeer; and serving a new reader) gives up after this long.
  absl::Duration init_timeout = absl::Seconds(30);
  // A transfer without progress for this long (no ack from the source; or, once it is the
  // oldest posted one, not finished) is taken for a silent peer: abort, UNAVAILABLE. The source
  // uses it for the oldest transfer it serves.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // Staging ring per connection: staging_buffers device buffers of staging_chunk_bytes. Packed
  // messages are at most this long; a pair uses the smaller of both sides' values. Defaults:
  // the best measured on 2 H200s (kvtransfer/BENCHMARKS.md, "NcclAgent"): NCCL's cost per message
  // (~15-20 us) wants long messages, a third buffer absorbs jitter between copy and send.
  uint64_t staging_chunk_bytes = uint64_t{128} << 20;
  int staging_buffers = 3;
  // Ops at least this long travel as one NCCL message of their own, pool to pool.
  uint64_t direct_min_bytes = uint64_t{32} << 20;
  // CTAs (512 threads) of the gather / scatter kernel (copy_mode kKernel / kStreamingKernel);
  // the rest of the SMs stay free for NCCL.
  int copy_ctas = 32;
  // What moves bytes between the pools and the staging ring (nccl_agent_copy.h). The kernel:
  // on two 2-H100 machines (2026-11-28) it moved random 2 MiB blocks at 95-103% of raw NCCL for
  // >= 64 blocks, the copy engines at 74-81% (one copy per block, issued from the host). On
  // 2 H200s (2026-11) the engines had measured 94-97% and a one-communicator gather kernel ~89%
  // (kvtransfer/BENCHMARKS.md, "NcclAgent vs raw NCCL" and "NCCL on two H100s"). Re-shards use
  // the kernel in every mode.
  nccl_copy::CopyMode copy_mode = nccl_copy::CopyMode::kKernel;
  // Transfers of one peer whose kRead is out at once (reader side).
  int max_posted_transfers = 4;
  // Communicators (each with its own NCCL stream) per reader/source pair, 1 or 2; the reader's
  // value holds for the pair. With 2, NCCL messages alternate between them, so NCCL's start-up
  // cost of one message overlaps the tail of the one before: 256 / 1024 random blocks went from
  // ~89% to ~94-95% of raw NCCL on 2 H200s (kvtransfer/BENCHMARKS.md, "NcclAgent").
  int num_comms = 2;
  // A transfer alone on its connection (nothing else posted or running: a decode worker
  // loading one request's KV) asks for packed messages of about an eighth of its size, at
  // least this long (nccl_plan::LoneTransferChunk), instead of staging_chunk_bytes: one 128 MiB
  // message cannot overlap its own gather and scatter. 0 = always staging_chunk_bytes.
  uint64_t lone_min_chunk_bytes = uint64_t{32} << 20;
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
  // A short-lived access token for the control socket ("" without control_token_key).
  std::string IssueAccessToken() override { return auth_.Issue(); }
  // Blocks until the communicators are up, at most connect_timeout + init_timeout. UNAVAILABLE
  // when the peer cannot be reached or hung up, DEADLINE_EXCEEDED when it never joined.
  absl::Status AddPeer(const std::string& peer_name,
                       const tandem::v1::TransferHandshake& peer) override;
  void RemovePeer(const std::string& peer_name) override;
  absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                      absl::Span<const CopyOp> ops) override;
  // Any connected peer, any region: the source gathers the rows into its staging ring and the
  // reader scatters them out of its own (nccl_agent_plan.h); strided ops always travel packed.
  bool CanReadStrided(const std::string& peer_name, uint32_t local_region) override;
  absl::StatusOr<TransferId> PostStridedRead(const std::string& peer_name,
                                             absl::Span<const StridedCopyOp> ops) override;
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
  struct Posted;

  explicit NcclAgent(NcclAgentOptions options);  // out of line: members hold incomplete types
  absl::Status Init();
  void AcceptLoop();
  // Reader (nccl_agent_reader.cc): one thread per peer.
  void PeerLoop(Peer* peer);
  // Reader: the TCP connection (`fd`, -1 until connected), the hello and the communicators.
  absl::Status ConnectPeer(Peer* peer, int* fd, std::unique_ptr<NcclLink>* link);
  // Reader: queues `fresh` in `awaiting` and sends their kReads (`alone`: nothing else is out,
  // the chunks are sized for one transfer). Returns the connection's status.
  absl::Status SendReads(int fd, const std::vector<Transfer*>& fresh, bool alone,
                         std::deque<Posted>* awaiting);
  // Reader: `peer`'s connection ended (removed, or failed with `conn_status`): ends every
  // transfer it had posted, running or queued.
  void EndConnectionLocked(Peer* peer, const absl::Status& conn_status,
                           const std::deque<Posted>& awaiting, const std::deque<Posted>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Source (nccl_agent_source.cc): one thread per reader it serves.
  void ServeLoop(Served* served);
  // Reader: reads the acks that arrived, enqueues accepted transfers on `link` (moved from
  // `awaiting` to `running`), ends refused ones. Returns the connection's status.
  absl::Status ReadAcks(Peer* peer, int fd, NcclLink* link, std::deque<Posted>* awaiting,
                        std::deque<Posted>* running);
  // Reader: ends the transfers `link` finished, oldest first.
  absl::Status RetireFinished(NcclLink* link, std::deque<Posted>* running);
  // Source: answers one kRead and enqueues its sends. Returns the connection's status.
  absl::Status Serve(int fd, const std::string& payload, NcclLink* link);
  // Where `ops` lie in this agent's regions: the local side (reader) or the remote side.
  std::vector<nccl_plan::OpPlace> OpPlaces(absl::Span<const StridedCopyOp> ops, bool local) const;
  // The connected peer a Post* of `num_ops` ops goes to, and the lengths of our regions.
  // NOT_FOUND / UNAVAILABLE; INVALID_ARGUMENT for more than kMaxOpsPerRead ops.
  absl::StatusOr<Peer*> PostTargetLocked(const std::string& peer_name, size_t num_ops,
                                         std::vector<uint64_t>* local_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a transfer of validated, coalesced ops on `peer`'s thread.
  TransferId QueueLocked(Peer* peer, std::vector<StridedCopyOp> ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(Transfer* t, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops `peer`'s thread and joins it (mu_ must not be held).
  static void StopPeer(Peer* peer);

  const NcclAgentOptions options_;
  nccl_auth::ControlTokenAuthority auth_;  // thread-safe
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the accept loop on destruction
  std::string address_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Served>> served_ ABSL_GUARDED_BY(mu_);
  TransferTable<Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_H_
