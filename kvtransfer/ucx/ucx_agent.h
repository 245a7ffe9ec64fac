// UcxAgent: the TransferAgent over UCX RMA (ucp_get_nbx): one UCP context, one worker and one
// progress thread per agent; per peer a data endpoint (shared memory where it can) and a
// monitor endpoint that detects peer failure; GETs from shared-memory segments done as direct
// copies on copy threads; CUDA memory staged through pinned host buffers (readers) and a
// host mirror synced by SyncForRemoteRead (sources). The design, the failure model and why
// each choice was made: kvtransfer/ucx/DESIGN.md. The implementation
// (UCX types, private state) is in ucx_agent_impl.h.
//
// Wire objects (FillLocalDescriptor) are opaque UCX bytes that UCX parses without validation:
// they must come from a checked handshake (kvtransfer/handshake.h), never from an untrusted
// party.
//
// Thread safety: all methods are thread-safe.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_AGENT_H_
#define TANDEM_KVTRANSFER_UCX_UCX_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_agent.h"

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
  // as active messages over TCP (DESIGN.md), larger segments mean fewer round
  // trips per request.
  uint64_t tcp_segment_bytes = 0;
  // Adds UCP_FEATURE_AM to the context. UCX 1.13 selects zero-copy "rma_bw" lanes only for
  // contexts with AM or TAG, so keep it on.
  bool enable_am = true;
  // Data and monitor endpoint per peer (DESIGN.md); false: one PEER endpoint.
  bool separate_data_endpoint = true;
  // Direct copies from regions the data endpoint maps (DESIGN.md); false: every
  // GET through ucp_get_nbx.
  bool direct_copy = true;
  // Threads that run direct copies (DESIGN.md): the progress thread plus
  // copy_threads - 1 helper threads. 1: the progress thread alone (the behaviour before). Default
  // 2, measured on the 2-core dev VM (random 2 MiB blocks, >= 64 per transfer): 1 thread copies
  // 15-16 GB/s, 2 threads 20-25 (kvtransfer/BENCHMARKS.md); 3 no more than 2. Each helper is a
  // thread that sleeps unless copies are queued. Create() refuses values outside [1, 64]
  // (INVALID_ARGUMENT).
  int copy_threads = 2;
  // Direct copies use non-temporal stores (streaming_copy.h) when their transfer moves at least
  // this many bytes: a smaller transfer fits the last-level cache and finishes sooner with
  // ordinary stores (1-4 blocks of 2 MiB: 0.28 vs 0.4 ms here). UINT64_MAX: always memcpy.
  uint64_t min_streaming_transfer_bytes = uint64_t{16} << 20;
  // Accept CUDA memory without UCX CUDA support by staging it (DESIGN.md).
  bool stage_cuda_memory = false;
  // CUDA staging (DESIGN.md): pinned host buffers a READ into device memory
  // passes through (>= 2 so one fills while another drains to the GPU), each this large.
  int cuda_staging_buffers = 4;
  uint64_t cuda_staging_bytes = uint64_t{4} << 20;
  // A staged CUDA region's host mirror is page-locked in granules of this many bytes, each the
  // first time SyncForRemoteRead copies into it, and so is a peer's mirror mapped here, each
  // granule the first time a request DMAs from it (kvtransfer/host_pin_granules.h); a peer's
  // mapped segment is likewise populated (MADV_POPULATE_READ) granule by granule as requests
  // first read it. 0: the whole mirror pinned at registration, the whole mapping populated at
  // AddPeer and pinned at the first read. Use one value on every worker: a reader with 0
  // populates a lazily filled peer mirror whole (allocating all of it). nvidia-h200-x4,
  // 2026-11-28, an 8B prefill + decode pair at --gpu_memory_utilization=0.85 (~104 GB pools):
  // with 0 each worker's registration took 81 s (healthy after 84 s), with 16 MiB 14 ms (healthy
  // after 3 s, 17 requests P -> D in 8 s, no failed KV load); ucx_gpu_test passes with 0, 1 MiB
  // and 16 MiB (runtime/cuda/BENCHMARKS.md). Mixed workers export no pool at all.
  uint64_t cuda_mirror_pin_granule_bytes = uint64_t{16} << 20;
  // Staged reads from a region mapped here go host -> device by DMA from the mapping itself
  // (DESIGN.md); false: always through the staging buffers.
  bool cuda_dma_from_mapped = true;
  // Strided reads from peers this agent does not map (another host: TCP, RDMA) as gathers at the
  // source (DESIGN.md, "Gathers at the source"): per request one active
  // message asks the source to pack the rows into one buffer and send it back, so only the kept
  // bytes cross the wire. Needs enable_am here and at the source (its handshake says so); false:
  // such peers get no strided reads (CanReadStrided false) and callers stage whole blocks.
  bool remote_gather = true;
  // Source side: gathered answers not yet sent, in bytes. A request past it is refused
  // (RESOURCE_EXHAUSTED: the reader's transfer fails). A reader keeps at most its
  // max_inflight_bytes in flight, so this bounds memory for many readers.
  uint64_t max_gather_answer_bytes = uint64_t{1} << 30;
  // Further UCX settings, names without the UCX_ prefix, e.g. {"RNDV_THRESH", "8k"}. These and
  // the fields above override UCX_* environment variables.
  std::vector<std::pair<std::string, std::string>> extra_config = {};
};

class UcxAgent : public TransferAgent {
 public:
  // INVALID_ARGUMENT for bad options; UNAVAILABLE when UCX cannot start.
  static absl::StatusOr<std::unique_ptr<UcxAgent>> Create(UcxAgentOptions options = {});

  // Host memory only (UNIMPLEMENTED for CUDA): ucp_mem_map with UCP_MEM_MAP_ALLOCATE, so
  // shared-memory lanes can read it directly. Zero-filled is not promised. Unmapped (freed)
  // by the agent's destructor.
  // (AllocateMemory, RegisterMemory and the rest: TransferAgent.)
  // SyncForRemoteRead copies ranges of a staged CUDA region device -> host mirror; OK at once
  // for other regions. AddPeer blocks until the endpoint is wired up (at most connect_timeout).

  // Whether the context can register CUDA memory (false on CPU-only builds of UCX).
  virtual bool SupportsCudaMemory() const = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_UCX_AGENT_H_
