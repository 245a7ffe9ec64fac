// UcxAgentImpl: UcxAgent's implementation (ucx_agent.cc, ucx_agent_progress.cc,
// ucx_agent_staging.cc, ucx_agent_gather.cc). Only those files and the agent's own tests include
// this header; the design it implements is in kvtransfer/ucx/DESIGN.md.
//
// Thread safety: all methods are thread-safe. UCX runs in UCS_THREAD_MODE_SERIALIZED: every
// UCX call, including the callbacks inside ucp_worker_progress, happens under mu_. Direct-copy
// helpers touch agent state only under mu_ and copy bytes without it.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_AGENT_IMPL_H_
#define TANDEM_KVTRANSFER_UCX_UCX_AGENT_IMPL_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/host_pin_granules.h"
#include "kvtransfer/streaming_copy.h"
#include "kvtransfer/transfer_agent.h"
#include "kvtransfer/transfer_table.h"
#include "kvtransfer/ucx/ucx_agent.h"
#include "kvtransfer/ucx/ucx_gather_wire.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

class UcxAgentImpl final : public UcxAgent {
 public:
  friend class UcxAgent;  // Create
  ~UcxAgentImpl() override;
  UcxAgentImpl(const UcxAgentImpl&) = delete;
  UcxAgentImpl& operator=(const UcxAgentImpl&) = delete;

  std::string transport() const override { return "ucx"; }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override;
  // Host memory only (UNIMPLEMENTED for CUDA): ucp_mem_map with UCP_MEM_MAP_ALLOCATE, so
  // shared-memory lanes can read it directly. Zero-filled is not promised. Unmapped (freed)
  // by ~UcxAgent.
  absl::StatusOr<std::pair<void*, uint32_t>> AllocateMemory(uint64_t length,
                                                            tandem::v1::MemoryKind kind) override;
  // Copies `ranges` of a staged CUDA region device -> host mirror (DESIGN.md);
  // OK at once for other regions. OUT_OF_RANGE for a bad region or range.
  absl::Status SyncForRemoteRead(uint32_t region, absl::Span<const ByteRange> ranges) override;
  absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) override;
  // Blocks until the endpoint is wired up (at most connect_timeout); UNAVAILABLE when the
  // peer cannot be reached.
  absl::Status AddPeer(const std::string& peer_name,
                       const tandem::v1::TransferHandshake& peer) override;
  void RemovePeer(const std::string& peer_name) override;
  absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                      absl::Span<const CopyOp> ops) override;
  // Strided reads are direct copies (or, into staged CUDA memory, a copy into a staging buffer
  // and one 2D device copy, or one 2D DMA from the mapping) from peers whose every region the
  // data endpoint maps (same host, shared memory) with direct_copy on. Over other lanes (TCP,
  // RDMA) UCX has no strided GET: there they are gathers at the source (remote_gather, and the
  // peer's handshake says it answers them); without, CanReadStrided says false.
  bool CanReadStrided(const std::string& peer_name, uint32_t local_region) override;
  absl::StatusOr<TransferId> PostStridedRead(const std::string& peer_name,
                                             absl::Span<const StridedCopyOp> ops) override;
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  TransferAgentStats Stats() const override;

  // Whether the context can register CUDA memory (false on CPU-only builds of UCX).
  bool SupportsCudaMemory() const override { return cuda_supported_; }

 private:
  struct LocalRegion {
    char* base;  // staged CUDA regions: the host mirror
    uint64_t length;
    ucp_mem_h memh;
    std::string packed_rkey;
    tandem::v1::MemoryKind kind;
    char* device = nullptr;  // staged CUDA regions: the device memory
    // Staged CUDA regions: the mirror's page-locked granules, pinned as SyncForRemoteRead first
    // copies into them (options_.cuda_mirror_pin_granule_bytes; 0: the whole mirror at once).
    std::unique_ptr<HostPinGranules> mirror_pins = nullptr;
  };
  struct RemoteRegion {
    uint64_t base;
    uint64_t length;
    ucp_rkey_h rkey;
    ucp_ep_h ep;                   // the endpoint its GETs use (the rkey was unpacked on it)
    const char* mapped = nullptr;  // data endpoint only: local address of `base` (rkey_ptr)
    // cuda_dma_from_mapped: `mapped`'s page-locked granules, pinned as requests first read them
    // (made on the first such request).
    std::unique_ptr<HostPinGranules> pins = nullptr;
    // cuda_mirror_pin_granule_bytes > 0: `mapped`'s granules whose page tables are populated
    // (MADV_POPULATE_READ), each as a request first reads it; 0: all of it at AddPeer. A peer's
    // CUDA mirror holds only what it synced: populating all of it faulted in (allocated) the
    // whole segment (issue 31: ~100 GB, ~85 s inside the first P->D load of an 8B pair).
    std::unique_ptr<HostPinGranules> populated = nullptr;
  };
  // One endpoint: kActive -> kDraining (stopped; waits for its requests) -> kClosing (rkeys
  // destroyed, ucp_ep_close_nbx in progress) -> kClosed. A closed Conn that peers_ still names
  // (the endpoint failed) stays as a tombstone so PostRead can say UNAVAILABLE; otherwise it is
  // freed. Lives at least until no request of it is outstanding.
  struct Conn {
    enum class State { kActive, kDraining, kClosing, kClosed };
    UcxAgentImpl* agent = nullptr;
    std::string name;
    ucp_ep_h ep = nullptr;               // data endpoint: every GET, the rkeys
    ucp_ep_h monitor_ep = nullptr;       // separate_data_endpoint only: failure detection
    std::vector<RemoteRegion> regions;   // rkeys; cleared when destroyed
    std::vector<uint64_t> region_bytes;  // from the descriptor, for validation
    bool gather = false;                 // the peer answers gather requests (its handshake)
    std::string gather_key;              // and wants this key in them
    State state = State::kActive;
    absl::Status failure;               // not OK once the endpoint failed
    int inflight = 0;                   // posted requests not yet completed
    std::vector<void*> close_requests;  // of ep and monitor_ep
    bool pinned = false;  // AddPeer still uses it (while it waits for the wireup unlocked)
    absl::Time draining_since;
  };
  struct Transfer {
    TransferId id = 0;
    Conn* conn = nullptr;
    // Coalesced; a PostRead op is one row. Requests split a one-row op by bytes and a strided
    // op by whole rows.
    std::vector<StridedCopyOp> ops;
    size_t next_op = 0;        // next request to post: ops[next_op] from next_offset
    uint64_t next_offset = 0;  // bytes into a one-row op, rows into a strided one
    int inflight = 0;
    uint64_t inflight_bytes = 0;
    absl::flat_hash_map<void*, uint64_t> requests;  // outstanding UCX request -> its bytes
    absl::Status error;                             // first error; stops posting
    bool cancel_requested = false;
    absl::Time cancelled_at = absl::InfiniteFuture();  // Cancel / StopTransferLocked
    bool ended = false;
    absl::Status result;
    uint64_t total_bytes = 0;
  };
  // A pinned host buffer that a READ into device memory passes through: filled by a GET or a
  // direct copy, then copied to the device on copy_stream_ (event slot = index).
  struct StagingSlot {
    enum class State { kFree, kFilling, kToDevice };
    int index = 0;
    char* host = nullptr;
    ucp_mem_h memh = nullptr;
    State state = State::kFree;
    Transfer* transfer = nullptr;
    char* device_dst = nullptr;
    const char* source = nullptr;  // non-null: copy from here (a pinned mapping), not `host`
    uint64_t bytes = 0;
    // A strided request: `rows` rows of `row_bytes`, `device_stride` apart on the device and
    // `source_stride` apart at `source` (`host` holds them packed). rows == 1: contiguous.
    uint64_t rows = 1;
    uint64_t row_bytes = 0;
    uint64_t device_stride = 0;
    uint64_t source_stride = 0;
  };
  // Reader side of a gather at the source (ucx_agent_gather.cc): a request sent, its answer (the
  // rows packed) not yet in. Counted as one outstanding request of its transfer.
  struct Gather {
    UcxAgentImpl* agent = nullptr;
    uint64_t token = 0;
    Transfer* transfer = nullptr;
    uint64_t bytes = 0;
    char* dest = nullptr;             // where the packed answer lands
    ucp_mem_h memh = nullptr;         // dest's registration, if any
    std::unique_ptr<char[]> scratch;  // dest, when the rows must be spread afterwards
    char* spread_to = nullptr;        // non-null: spread the packed rows here, `stride` apart
    uint64_t stride = 0;
    uint64_t rows = 0;
    uint64_t row_bytes = 0;
    StagingSlot* slot = nullptr;  // the answer lands in this staging buffer (device dest)
    void* receive = nullptr;      // a rendezvous answer's receive, while it runs
  };
  // A gather request's header while UCX sends it (freed by OnGatherRequestSent).
  struct SentGatherRequest {
    UcxAgentImpl* agent = nullptr;
    GatherRequest header;
  };
  // Source side: a gathered answer being sent (freed when the send completes).
  struct GatherAnswer {
    UcxAgentImpl* agent = nullptr;
    GatherReply header;
    std::unique_ptr<char[]> data;
    uint64_t bytes = 0;
    void* request = nullptr;  // the send
  };

  // A direct copy, queued in copy_queue_ and run outside the lock (DESIGN.md).
  struct DirectCopy {
    Transfer* transfer = nullptr;
    char* dst = nullptr;
    const char* src = nullptr;
    uint64_t bytes = 0;
    StagingSlot* slot = nullptr;     // non-null: dst is this staging buffer
    size_t min_streaming_bytes = 0;  // StreamingCopy's threshold for this copy
    // A strided request: `rows` rows of `row_bytes` (bytes = rows * row_bytes).
    uint64_t rows = 1;
    uint64_t row_bytes = 0;
    uint64_t dst_stride = 0;
    uint64_t src_stride = 0;
  };

  explicit UcxAgentImpl(UcxAgentOptions options) : options_(std::move(options)) {}
  absl::Status Init();

  void ProgressLoop();
  // A direct-copy helper thread: runs queued direct copies until stop_.
  void CopyLoop();
  bool CopyWorkOrStopLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || !copy_queue_.empty();
  }
  enum class Posted { kNothing, kRequest, kDirectCopy };
  // Posts at most one request; says what it did. A direct copy is not done here but queued in
  // copy_queue_ (already counted as outstanding) for a copy thread.
  Posted PostOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One request PostOneLocked carves from a transfer's next op: one row's next bytes, or whole
  // rows of a strided op.
  struct ReadRequest {
    const StridedCopyOp* op = nullptr;
    bool strided = false;
    uint64_t first_row = 0;  // strided ops
    uint64_t rows = 1;
    uint64_t bytes = 0;
    uint64_t local_offset = 0;
    uint64_t remote_offset = 0;
    uint64_t remote_span = 0;  // bytes read from the peer's region (strided: to the last row's end)
    char* dest = nullptr;      // where the bytes land (the staging buffer, when `slot`)
    StagingSlot* slot = nullptr;  // set up for the device copy
  };
  // The transfer at the front of post_queue_ with a request to post, or null; pops those with
  // nothing (more) to post and stops those whose connection closed.
  Transfer* NextTransferToPostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next request of `t` (not ended, ops left), at most `limit` bytes but at least one row.
  static ReadRequest NextRequest(const Transfer& t, uint64_t limit);
  // Moves `t` past `req` and sends it to the back of post_queue_ (round robin) if it has more.
  void AdvancePastRequestLocked(Transfer& t, const ReadRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts `req` the first way that applies: a DMA from the mapping, a direct copy, a gather at
  // the source, a UCX GET.
  Posted IssueRequestLocked(Transfer& t, const ReadRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostGetLocked(Transfer& t, const ReadRequest& req, RemoteRegion& remote)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PostRead / PostStridedRead after validation: queues a transfer of `ops` (coalesced).
  TransferId AddTransferLocked(Conn* conn, std::vector<StridedCopyOp> ops,
                               const std::string& peer_name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PostRead / PostStridedRead (`what`): the peer's connection (NOT_FOUND for an unknown name)
  // and the local regions' sizes, for validating the batch.
  absl::StatusOr<Conn*> PostTargetLocked(const char* what, const std::string& peer_name,
                                         std::vector<uint64_t>* local_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every region of `conn` is mapped for direct copies.
  bool AllRegionsMappedLocked(const Conn& conn) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the oldest queued direct copy, runs it with mu_ released and ends its request.
  void RunQueuedCopyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishDirectCopyLocked(const DirectCopy& copy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts one posted request of `bytes` as outstanding.
  void CountPostedLocked(Transfer& t, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends one outstanding request of `t` (undoes CountPostedLocked) with `status`.
  void EndRequestLocked(Transfer& t, uint64_t bytes, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CUDA staging (ucx_agent_staging.cc).
  absl::StatusOr<uint32_t> RegisterStagedCudaLocked(char* device, uint64_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InitStagingLocked(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StagingSlot* FreeStagingSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot's buffer holds its bytes (or slot.source, when set, is the pinned mapping to copy
  // from): start the device copy (or end the request on error or when the transfer was stopped
  // meanwhile).
  void StartToDeviceLocked(StagingSlot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether staged reads from `remote` may DMA from its mapping (pins it on first use).
  // Whether a request may DMA [offset, offset + bytes) of `remote`'s mapping straight to the
  // device: cuda_dma_from_mapped, and those bytes page-locked (pinned here on first use).
  bool DmaFromMappedLocked(RemoteRegion& remote, uint64_t offset, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the requests whose device copies finished; returns whether any did.
  bool PollStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DestroyStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void OnStagedGetDone(void* request, ucs_status_t status, void* user_data);
  // Advances draining/closing endpoints; returns whether any is still pending.
  bool ReapConnsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stopped transfer whose UCX requests still have not completed kCancelForceAfter later (a
  // wedged peer: SIGSTOP, a dead link before keepalive notices; ucp_request_cancel cannot take
  // back an RMA GET) closes its connection by force, which completes them as cancelled, so a
  // cancel always ends. The peer's later reads fail UNAVAILABLE until it is added again.
  void ForceStuckCancelsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Flushes `ep` of a new Conn, progressing the worker (mu_ is released while yielding).
  absl::Status WaitConnectedLocked(Conn* conn, ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `length` bytes of host memory allocated by UCX in a shared-memory domain (its first working
  // UCX_MEM_ALLOC_METHODS method: sysv, posix, ...), so same-host readers' transports GET from
  // it directly (and the agent maps it for direct copies). `*memh` owns it (ucp_mem_unmap).
  absl::StatusOr<char*> MapSharedHostMemory(uint64_t length, ucp_mem_h* memh);
  absl::StatusOr<uint32_t> AddRegionLocked(char* base, uint64_t length, ucp_mem_h memh,
                                           tandem::v1::MemoryKind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WaitIdle();
  void Wake();
  // Stops every transfer on `conn` with `reason` and starts draining it.
  void StopConnLocked(Conn* conn, const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopTransferLocked(Transfer& t, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeEndLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRequestDone(Transfer& t, void* request, uint64_t bytes, ucs_status_t status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DestroyRkeysLocked(Conn* conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a closed Conn unless peers_ still names it.
  void MaybeFreeConnLocked(Conn* conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static void OnGetDone(void* request, ucs_status_t status, void* user_data);
  // Gathers at the source (ucx_agent_gather.cc).
  absl::Status RegisterGatherHandlersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a reader may ask this agent for gathers: every region is host memory (a staged
  // CUDA region's host mirror counts).
  bool AnswersGathersLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sends the request for `rows` rows of `op` from row `first_row` (the caller counts nothing;
  // this counts the request as outstanding). `slot`: the answer goes through this staging buffer
  // (already set up for the device copy).
  void PostGatherLocked(Transfer& t, const StridedCopyOp& op, uint64_t first_row, uint64_t rows,
                        StagingSlot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a gather: spreads or stages its rows when `status` is OK, then ends its request.
  void FinishGatherLocked(uint64_t token, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stopped transfer's gathers still waiting for their answers end now (a late answer is
  // dropped); those whose answer is being received end when the receive does.
  void AbandonGathersLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendGatherAnswerLocked(ucp_ep_h reply_ep, std::unique_ptr<GatherAnswer> answer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Teardown: cancels the answers still being sent and progresses until they end (at most
  // `timeout`). Returns whether none is left (UCX 1.13 aborts in ucp_worker_destroy on an
  // endpoint that still has requests: an answer to a reader that vanished mid-rendezvous).
  bool DrainGatherAnswersLocked(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static ucs_status_t OnGatherRequest(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnGatherAnswer(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);
  static void OnGatherRequestSent(void* request, ucs_status_t status, void* user_data);
  static void OnGatherAnswerSent(void* request, ucs_status_t status, void* user_data);
  static void OnGatherReceived(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const UcxAgentOptions options_;
  ucp_context_h context_ = nullptr;
  bool cuda_supported_ = false;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;    // eventfd
  int worker_fd_ = -1;  // ucp_worker_get_efd, -1 when unsupported (then short sleeps)

  mutable absl::Mutex mu_;
  ucp_worker_h worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string worker_address_ ABSL_GUARDED_BY(mu_);
  std::vector<LocalRegion> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Conn*> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);  // all live endpoints
  TransferTable<Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<TransferId> post_queue_ ABSL_GUARDED_BY(mu_);  // transfers with requests to post
  uint64_t inflight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int inflight_requests_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<DirectCopy> copy_queue_ ABSL_GUARDED_BY(mu_);  // posted, not yet running
  // Direct copies queued or running (part of inflight_requests_): unlike UCX requests and
  // device copies they need no polling, so the progress thread may sleep while only they run.
  int direct_copies_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<StagingSlot> staging_ ABSL_GUARDED_BY(mu_);  // fixed once created
  // Gathers (ucx_agent_gather.cc): the reader's, by token (random: an answer names its request),
  // and the source's answers being sent.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Gather>> gathers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<GatherAnswer*, std::unique_ptr<GatherAnswer>> answers_ ABSL_GUARDED_BY(mu_);
  uint64_t answer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen token_gen_ ABSL_GUARDED_BY(mu_);
  // The key a gather request must carry (ucx_gather_wire.h); set in Init, empty when this agent
  // answers no gathers.
  std::string gather_key_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CudaCopyStream> copy_stream_ ABSL_GUARDED_BY(mu_);
  std::thread progress_thread_;
  std::vector<std::thread> copy_threads_;  // the copy_threads - 1 helpers
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_UCX_AGENT_IMPL_H_
