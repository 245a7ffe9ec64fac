// TransferAgent: moves bytes of registered KV pools between two workers (ARCHITECTURE.md,
// "Connector API"). One agent per worker process; the connector above it speaks in blocks, the
// agent in byte ranges of registered regions.
//
// Life of a pull (D reads P's blocks):
//   P: agent.RegisterMemory(pool)                 once, at start
//   D: agent.RegisterMemory(pool)                 once, at start
//   D -> P handshake (kvtransfer/handshake.h, over gRPC KvTransferService): each side's
//      LocalDescriptor() travels in a TransferHandshake; each side calls AddPeer(peer).
//   D: id = agent.PostRead(peer, ops)             batched RMA GET of (remote, local) ranges
//   D: agent.CheckTransfer(id) until done         or Cancel(id) and keep polling until it ends
//
// Contract shared by every backend (UCX, NCCL, in-process, fault injection):
//  * Nothing blocks forever: a dead peer, a refused connection or a transport error fails every
//    outstanding transfer to that peer with UNAVAILABLE (or the converted transport error).
//  * A transfer is "ended" when CheckTransfer returns anything but `false`: OK(true) (all bytes
//    arrived), or an error (CANCELLED after Cancel, UNAVAILABLE for a dead peer, ...). Only an
//    ended transfer guarantees that no more bytes will be written into its local ranges, so the
//    caller may reuse those blocks only after the end is observed. After the end is reported
//    once, the id is forgotten (NOT_FOUND afterwards).
//  * Thread safety: all methods are thread-safe (a backend may run its own progress thread).
#ifndef TANDEM_KVTRANSFER_TRANSFER_AGENT_H_
#define TANDEM_KVTRANSFER_TRANSFER_AGENT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

using TransferId = uint64_t;

// One contiguous copy: `length` bytes from the peer's registered region `remote_region` at
// `remote_offset` into the local registered region `local_region` at `local_offset`.
// Regions are indexed in registration order (0 = the first RegisterMemory call).
struct CopyOp {
  uint32_t local_region = 0;
  uint64_t local_offset = 0;
  uint32_t remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// A strided copy: `rows` rows of `row_bytes` each, row i from the peer's `remote_region` at
// `remote_offset + i * remote_stride` into the local `local_region` at
// `local_offset + i * local_stride`. One descriptor moves a head slice of a run of KV blocks
// between ranks of different tensor-parallel splits (kvtransfer/reshard.h, StridedHeadOps):
// the re-sharding happens inside the copy, never one transfer per token or per head.
// REQUIRES (ValidateStridedCopyOps): rows, row_bytes > 0; strides >= row_bytes (rows do not
// overlap).
struct StridedCopyOp {
  uint32_t local_region = 0;
  uint64_t local_offset = 0;
  uint64_t local_stride = 0;
  uint32_t remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t remote_stride = 0;
  uint64_t row_bytes = 0;
  uint64_t rows = 0;
};

// A byte range of one registered region.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Counters for Stats / metrics.
struct TransferAgentStats {
  uint64_t bytes_read = 0;  // completed READ bytes (this side was the reader)
  uint64_t transfers_completed = 0;
  uint64_t transfers_failed = 0;  // includes cancelled
  uint64_t peers = 0;
};

class TransferAgent {
 public:
  virtual ~TransferAgent() = default;

  // "ucx", "nccl", "inprocess", ...: goes into TransferHandshake.transport; peers must match.
  virtual std::string transport() const = 0;

  // Registers [base, base + length) for remote access and as a local target. Returns the
  // region index. kind says where the memory lives (host or CUDA device memory).
  virtual absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                                  tandem::v1::MemoryKind kind) = 0;

  // Allocates `length` bytes the transport can share best (e.g. UCX-mapped memory that
  // shared-memory transports can read directly), registers them like RegisterMemory, and
  // returns {pointer, region index}. The memory lives until the agent is destroyed.
  // UNIMPLEMENTED: the caller allocates and calls RegisterMemory.
  virtual absl::StatusOr<std::pair<void*, uint32_t>> AllocateMemory(
      uint64_t /*length*/, tandem::v1::MemoryKind /*kind*/) {
    return absl::UnimplementedError("AllocateMemory");
  }

  // Source side: makes the current contents of `ranges` of local region `region` visible to
  // remote readers, and returns once they are. Backends that serve device memory through a host
  // mirror (UcxAgent without UCX CUDA transports, see ucx_agent.h) copy those ranges device ->
  // mirror here; for every other region and backend this is a no-op. Call it after the KV of
  // held blocks is final and before their handle is published. OUT_OF_RANGE for a bad range.
  virtual absl::Status SyncForRemoteRead(uint32_t /*region*/,
                                         absl::Span<const ByteRange> /*ranges*/) {
    return absl::OkStatus();
  }

  // Fills the transport fields of `handshake` (transport, worker_address, regions) so a peer
  // can reach this agent and address its registered regions. Leaves the other fields alone.
  virtual absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) = 0;

  // Source side: a fresh short-lived token whose possession a reader's agent must prove when it
  // opens this agent's own transport connection (TransferHandshake.access_token: the source's
  // KvTransferService hands one out with each handshake it answers, i.e. only to readers the
  // control plane authenticated). Empty: this transport checks none (the default; UCX and the
  // in-process agent, or an agent configured without a token key).
  virtual std::string IssueAccessToken() { return std::string(); }

  // Connects to the peer described by `peer` (its FillLocalDescriptor output) under `peer_name`.
  // INVALID_ARGUMENT for a descriptor of another transport or a malformed one; re-adding a name
  // replaces the old connection (a restarted peer with a new epoch).
  virtual absl::Status AddPeer(const std::string& peer_name,
                               const tandem::v1::TransferHandshake& peer) = 0;
  // Disconnects; outstanding transfers to the peer end with CANCELLED. No-op for unknown names.
  virtual void RemovePeer(const std::string& peer_name) = 0;

  // Posts one batched READ of all `ops` from `peer_name` (contiguous runs may be coalesced by
  // the backend). NOT_FOUND for an unknown peer, OUT_OF_RANGE for a range outside a region,
  // INVALID_ARGUMENT for an empty batch. Never blocks on the network.
  virtual absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                              absl::Span<const CopyOp> ops) = 0;

  // Whether PostStridedRead from `peer_name` into local region `local_region` works and moves
  // each byte once (no staging pass on top of the transport's own copy). false (the default)
  // for unknown peers and backends without strided reads: the caller stages whole blocks.
  virtual bool CanReadStrided(const std::string& /*peer_name*/, uint32_t /*local_region*/) {
    return false;
  }

  // Posts one batched READ of strided copies (StridedCopyOp), ended and polled like PostRead's.
  // UNIMPLEMENTED where CanReadStrided is false; otherwise PostRead's errors.
  virtual absl::StatusOr<TransferId> PostStridedRead(const std::string& /*peer_name*/,
                                                     absl::Span<const StridedCopyOp> /*ops*/) {
    return absl::UnimplementedError("strided reads");
  }

  // false: still in flight. true: ended successfully. Error: ended with that error. See the
  // header comment for when an id is forgotten.
  virtual absl::StatusOr<bool> CheckTransfer(TransferId id) = 0;

  // Asks an in-flight transfer to stop. It still has to be polled until it ends (CANCELLED, or
  // OK when it finished first). No-op for unknown ids.
  virtual void Cancel(TransferId id) = 0;

  virtual TransferAgentStats Stats() const = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_AGENT_H_
