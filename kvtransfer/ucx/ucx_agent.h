// UcxAgent: the TransferAgent over UCX RMA (ucp_get_nbx). One UCP context and one worker per
// agent; one progress thread drives the worker.
//
// Wire objects (FillLocalDescriptor): worker_address = ucp_worker_get_address bytes; one
// MemoryRegion per RegisterMemory/AllocateMemory with packed_rkey = ucp_rkey_pack of its
// ucp_mem_map handle. Both are opaque UCX bytes that UCX parses without validation: they must
// come from a checked handshake (kvtransfer/handshake.h), never from an untrusted party.
//
// Endpoints (AddPeer), with separate_data_endpoint (default): per peer a DATA endpoint without
// error handling (UCP_ERR_HANDLING_MODE_NONE) plus a MONITOR endpoint with
// UCP_ERR_HANDLING_MODE_PEER and keepalive. Why two: UCX 1.13 only picks transports with
// peer-failure support for PEER endpoints, which on one host excludes shared memory (see
// below); the NONE endpoint may use sysv/posix. A remote region whose rkey the data endpoint
// can map directly (ucp_rkey_ptr: a shared-memory segment, e.g. the peer's AllocateMemory) is
// read over the data endpoint; such GETs are plain copies that finish inside ucp_get_nbx and
// cannot hang on a dead peer. Every other region is read over the monitor endpoint, because a
// GET on a NONE endpoint that needs the peer's answer (active-message emulation) would never
// fail if the peer died. When the monitor fails, every transfer to the peer is stopped with
// UNAVAILABLE and both endpoints are force-closed at once; outstanding requests complete as
// cancelled before the transfer is reported ended. Without separate_data_endpoint, one PEER
// endpoint does everything (the behaviour before).
//
// A transfer (PostRead) is its coalesced copy runs split into requests of at most
// max_request_bytes. PostRead only queues them; the progress thread posts them with at most
// max_inflight_bytes outstanding per agent (shared memory GETs copy synchronously inside
// ucp_get_nbx, so posting on the caller's thread would block it). A transfer ends when every
// posted request completed and either all were posted or it was stopped (Cancel, RemovePeer,
// peer failure): Cancel stops posting and ucp_request_cancel()s the outstanding requests.
//
// Failure: the endpoint error callback (peer died, connection reset; keepalive finds silent
// deaths) ends every transfer to that peer with UNAVAILABLE once its requests have completed;
// a failed request ends its transfer with the converted UCX error. The failed endpoint is
// force-closed; the peer stays known (NOT_FOUND only after RemovePeer) and new PostReads to it
// fail UNAVAILABLE until AddPeer reconnects. Endpoints are always force-closed (bounded time,
// no wait for the peer); RemovePeer ends the peer's transfers with CANCELLED.
//
// Progress thread: while UCX requests or device copies are outstanding it polls
// ucp_worker_progress (yielding between empty polls); while it has direct copies queued it runs
// them (see below); otherwise it arms the worker and sleeps in epoll on the worker's event fd plus
// an eventfd that PostRead/AddPeer/RemovePeer/~UcxAgent signal, and the copy helpers when a
// finished copy leaves it work (room to post more, a device copy to poll), waking at least every
// idle_wakeup for keepalive. An idle agent uses no CPU, yet still serves GETs that need the
// target's progress (see below) because incoming traffic wakes it.
//
// Which transport moves the bytes (UCX 1.13, Debian, measured with bench_main.cc): with RDMA
// NICs (rc/dc) ucp_get is a native RDMA READ. On one host with "tcp,self,sm": a PEER endpoint
// only gets TCP (the shared-memory transports lack peer-failure support), so GETs run as
// active messages over TCP loopback (~1 GB/s). A NONE endpoint gets sysv/posix lanes for RMA,
// but their GET is a direct copy only from memory the same shared-memory domain allocated
// (its rkey names the segment): pools from AllocateMemory (ucp_mem_map ALLOCATE, UCX picks
// sysv first) are read in place (direct copies, below); plain RegisterMemory pools are not
// mapped, so they are read over the monitor endpoint (TCP, as before). cma is only used by UCX
// 1.13 for rendezvous, never for the RMA API.
//
// Destruction force-closes every endpoint (outstanding requests complete as cancelled), then
// unmaps memory and destroys the worker: nothing is written into registered memory after
// ~UcxAgent returns.
//
// Direct copies (direct_copy, default): a GET from a region the data endpoint maps
// (ucp_rkey_ptr) is a memcpy inside ucp_get_nbx anyway; the agent does that copy itself, with
// non-temporal stores for large transfers (streaming_copy.h: glibc's memcpy, which UCX uses,
// keeps ordinary stores up to 192 MiB per call here, which costs ~40% of the bandwidth once a
// batch of 2 MiB blocks no longer fits the cache) and with mu_ released, so callers are not
// blocked behind a multi-megabyte copy. The progress thread queues a transfer's direct copies
// (one per request, up to max_inflight_bytes) and copy_threads threads run them in parallel:
// the progress thread itself plus copy_threads - 1 helpers. Why several: one core copies at
// 15-17 GB/s on the dev VM (each core has only so many cache-line misses in flight), two reach
// 20-25 GB/s. A queued copy counts as an outstanding request: the transfer, the endpoint and
// the rkey (which keeps the peer's segment mapped) outlive it. Stopping a transfer (Cancel,
// RemovePeer, peer failure, ~UcxAgent) drops its queued copies at once; copies already running
// finish (at most copy_threads x max_request_bytes) before the transfer is reported ended, so
// nothing is written after the end.
//
// Memory kinds: MEMORY_KIND_CUDA is registered with UCX directly when the UCP context reports
// CUDA memory support. Otherwise (Debian's UCX has no CUDA transports), CUDA builds stage when
// stage_cuda_memory is set (opt-in, because a source must then call SyncForRemoteRead before it
// publishes blocks; without the option CUDA memory stays UNIMPLEMENTED):
//  * Reading INTO device memory: each request GETs (or direct-copies) into one of
//    cuda_staging_buffers pinned host buffers, then cudaMemcpyAsync's it to the device on the
//    agent's copy stream; the buffer is free again when that copy's event completed, so while
//    one buffer drains to the GPU the next request fills another (double buffering or more).
//    A request, and so its transfer, ends only after its device copy ended: nothing is written
//    to device memory after the end is reported. Same-host shortcut (cuda_dma_from_mapped):
//    when the source region is mapped here (shared memory), the agent page-locks that mapping
//    once (cudaHostRegister, lazily at the first staged read from it) and the GPU copies from
//    it directly, with no CPU copy; the mapping stays registered until the rkey is destroyed,
//    which waits for the copies that read it. If page-locking fails, requests take the
//    staging buffers.
//  * Serving device memory to readers: the region gets a host MIRROR of its full size,
//    allocated like AllocateMemory (readers on the host copy it in place, over shared memory)
//    and page-locked for fast device -> host copies. The descriptor advertises the mirror
//    (base_address = the mirror's address). SyncForRemoteRead(region, ranges) copies ranges
//    device -> mirror; the source calls it for the blocks it holds for a reader before
//    publishing their handle. Why a mirror rather than staging on demand: reads stay one-sided
//    (one GET per request, no request/response protocol, no work or progress on the source,
//    a source that dies cannot leave a read half-staged), and the device -> host copy happens
//    once per held request on the source, off the reader's critical path. The price is pinned
//    host memory equal to the device region and a D2H copy per held request even when it is
//    never read. One CUDA device per agent (registering another device: UNIMPLEMENTED).
// CPU-only builds keep returning UNIMPLEMENTED for CUDA memory.
//
// Thread safety: all methods are thread-safe. UCX runs in UCS_THREAD_MODE_SERIALIZED: every
// UCX call, including the callbacks inside ucp_worker_progress, happens under mu_. Direct-copy
// helpers touch agent state only under mu_ and copy bytes without it.
#ifndef TANDEM_KVTRANSFER_UCX_AGENT_H_
#define TANDEM_KVTRANSFER_UCX_AGENT_H_

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
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/streaming_copy.h"
#include "kvtransfer/transfer_agent.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

struct UcxAgentOptions {
  // UCX_TLS. Default: loopback-friendly TCP plus shared memory (sysv/posix/cma) and self.
  std::string transports = "tcp,self,sm";
  // UCX_NET_DEVICES ("all" = every device UCX finds). Default loopback only.
  std::string net_device = "lo";
  // UCX_KEEPALIVE_INTERVAL: how fast a silently dead peer is found.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // Requests larger than this are split: bounds cancel latency and lock hold time.
  uint64_t max_request_bytes = uint64_t{4} << 20;
  // Posted-but-unfinished bytes over all transfers of this agent.
  uint64_t max_inflight_bytes = uint64_t{64} << 20;
  // AddPeer waits at most this long for the endpoint's wireup.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Longest idle sleep of the progress thread.
  absl::Duration idle_wakeup = absl::Milliseconds(100);
  // UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE (0: UCX's default, 8 KiB). Where GETs travel
  // as active messages over TCP (see the header comment), larger segments mean fewer round
  // trips per request.
  uint64_t tcp_segment_bytes = 0;
  // Adds UCP_FEATURE_AM to the context. UCX 1.13 selects zero-copy "rma_bw" lanes only for
  // contexts with AM or TAG, so keep it on.
  bool enable_am = true;
  // Data and monitor endpoint per peer (see the header comment); false: one PEER endpoint.
  bool separate_data_endpoint = true;
  // Direct copies from regions the data endpoint maps (see the header comment); false: every
  // GET through ucp_get_nbx.
  bool direct_copy = true;
  // Threads that run direct copies (see the header comment): the progress thread plus
  // copy_threads - 1 helper threads. 1: the progress thread alone (the behaviour before). Default
  // 2, measured on the 2-core dev VM (random 2 MiB blocks, >= 64 per transfer): 1 thread copies
  // 15-16 GB/s, 2 threads 20-25 (kvtransfer/README.md); 3 no more than 2. Each helper is a thread
  // that sleeps unless copies are queued. Create() refuses values outside [1, 64]
  // (INVALID_ARGUMENT).
  int copy_threads = 2;
  // Direct copies use non-temporal stores (streaming_copy.h) when their transfer moves at least
  // this many bytes: a smaller transfer fits the last-level cache and finishes sooner with
  // ordinary stores (1-4 blocks of 2 MiB: 0.28 vs 0.4 ms here). UINT64_MAX: always memcpy.
  uint64_t min_streaming_transfer_bytes = uint64_t{16} << 20;
  // Accept CUDA memory without UCX CUDA support by staging it (see the header comment).
  bool stage_cuda_memory = false;
  // CUDA staging (see the header comment): pinned host buffers a READ into device memory
  // passes through (>= 2 so one fills while another drains to the GPU), each this large.
  int cuda_staging_buffers = 4;
  uint64_t cuda_staging_bytes = uint64_t{4} << 20;
  // Staged reads from a region mapped here go host -> device by DMA from the mapping itself
  // (see the header comment); false: always through the staging buffers.
  bool cuda_dma_from_mapped = true;
  // Further UCX settings, names without the UCX_ prefix, e.g. {"RNDV_THRESH", "8k"}. These and
  // the fields above override UCX_* environment variables.
  std::vector<std::pair<std::string, std::string>> extra_config = {};
};

class UcxAgent final : public TransferAgent {
 public:
  static absl::StatusOr<std::unique_ptr<UcxAgent>> Create(UcxAgentOptions options = {});
  ~UcxAgent() override;
  UcxAgent(const UcxAgent&) = delete;
  UcxAgent& operator=(const UcxAgent&) = delete;

  std::string transport() const override { return "ucx"; }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override;
  // Host memory only (UNIMPLEMENTED for CUDA): ucp_mem_map with UCP_MEM_MAP_ALLOCATE, so
  // shared-memory lanes can read it directly. Zero-filled is not promised. Unmapped (freed)
  // by ~UcxAgent.
  absl::StatusOr<std::pair<void*, uint32_t>> AllocateMemory(uint64_t length,
                                                            tandem::v1::MemoryKind kind) override;
  // Copies `ranges` of a staged CUDA region device -> host mirror (see the header comment);
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
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  TransferAgentStats Stats() const override;

  // Whether the context can register CUDA memory (false on CPU-only builds of UCX).
  bool SupportsCudaMemory() const { return cuda_supported_; }

 private:
  struct LocalRegion {
    char* base;  // staged CUDA regions: the host mirror
    uint64_t length;
    ucp_mem_h memh;
    std::string packed_rkey;
    tandem::v1::MemoryKind kind;
    char* device = nullptr;      // staged CUDA regions: the device memory
    bool mirror_pinned = false;  // base is page-locked (CudaPinHostMemory)
  };
  struct RemoteRegion {
    uint64_t base;
    uint64_t length;
    ucp_rkey_h rkey;
    ucp_ep_h ep;                   // the endpoint its GETs use (the rkey was unpacked on it)
    const char* mapped = nullptr;  // data endpoint only: local address of `base` (rkey_ptr)
    // cuda_dma_from_mapped: whether `mapped` was page-locked for DMA (tried once, lazily).
    bool pin_tried = false;
    bool pinned = false;
  };
  // One endpoint: kActive -> kDraining (stopped; waits for its requests) -> kClosing (rkeys
  // destroyed, ucp_ep_close_nbx in progress) -> kClosed. A closed Conn that peers_ still names
  // (the endpoint failed) stays as a tombstone so PostRead can say UNAVAILABLE; otherwise it is
  // freed. Lives at least until no request of it is outstanding.
  struct Conn {
    enum class State { kActive, kDraining, kClosing, kClosed };
    UcxAgent* agent = nullptr;
    std::string name;
    ucp_ep_h ep = nullptr;               // data endpoint: every GET, the rkeys
    ucp_ep_h monitor_ep = nullptr;       // separate_data_endpoint only: failure detection
    std::vector<RemoteRegion> regions;   // rkeys; cleared when destroyed
    std::vector<uint64_t> region_bytes;  // from the descriptor, for validation
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
    std::vector<CopyOp> ops;  // coalesced
    size_t next_op = 0;       // next request to post: ops[next_op] from next_offset
    uint64_t next_offset = 0;
    int inflight = 0;
    uint64_t inflight_bytes = 0;
    absl::flat_hash_map<void*, uint64_t> requests;  // outstanding UCX request -> its bytes
    absl::Status error;                             // first error; stops posting
    bool cancel_requested = false;
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
  };
  // A direct copy, queued in copy_queue_ and run outside the lock (see the header comment).
  struct DirectCopy {
    Transfer* transfer = nullptr;
    char* dst = nullptr;
    const char* src = nullptr;
    uint64_t bytes = 0;
    StagingSlot* slot = nullptr;     // non-null: dst is this staging buffer
    size_t min_streaming_bytes = 0;  // StreamingCopy's threshold for this copy
  };

  explicit UcxAgent(UcxAgentOptions options) : options_(std::move(options)) {}
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
  bool DmaFromMappedLocked(RemoteRegion& remote) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the requests whose device copies finished; returns whether any did.
  bool PollStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DestroyStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void OnStagedGetDone(void* request, ucs_status_t status, void* user_data);
  // Advances draining/closing endpoints; returns whether any is still pending.
  bool ReapConnsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  absl::flat_hash_map<TransferId, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<TransferId> post_queue_ ABSL_GUARDED_BY(mu_);  // transfers with requests to post
  uint64_t inflight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int inflight_requests_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<DirectCopy> copy_queue_ ABSL_GUARDED_BY(mu_);  // posted, not yet running
  // Direct copies queued or running (part of inflight_requests_): unlike UCX requests and
  // device copies they need no polling, so the progress thread may sleep while only they run.
  int direct_copies_ ABSL_GUARDED_BY(mu_) = 0;
  TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<StagingSlot> staging_ ABSL_GUARDED_BY(mu_);  // fixed once created
  std::unique_ptr<CudaCopyStream> copy_stream_ ABSL_GUARDED_BY(mu_);
  std::thread progress_thread_;
  std::vector<std::thread> copy_threads_;  // the copy_threads - 1 helpers
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_AGENT_H_
