// RankKvReader: one rank's reader of KV blocks from a source worker of any tensor-parallel split
// (ARCHITECTURE.md "Worker groups"; issue: P and D groups of different TP exchange KV in bulk).
//
// Every rank of a group has its own transfer agent and pool holding its KV heads
// (RankGeometry). A source (a single rank, or a group whose handshake lists every rank's
// descriptor in TransferHandshake.ranks) is linked once (AddSource): PlanReshard
// (reshard.h) decides which source rank serves which of this rank's heads, and the agent
// connects to exactly those ranks. A read of a request's blocks then becomes, per piece of the
// plan:
//   * direct (the source rank holds exactly this rank's heads: equal TP, rank r <- rank r): ONE
//     agent read of whole blocks, contiguous runs coalesced, straight into the pool;
//   * strided (the heads are split differently, and the agent reads strided rows itself:
//     TransferAgent::CanReadStrided; UCX: direct copies between ranks of one host, gathers at
//     the source between hosts; NCCL: gathers at the source; into host or device pools): ONE
//     agent read of strided descriptors (reshard.h StridedHeadOps, one per run of blocks) that
//     moves exactly this rank's heads from the source rank's blocks into the pool: no staging
//     here, no second pass, and P tp < D tp moves only the kept bytes;
//   * staged (the heads are split differently, no strided reads: an agent or peer without them,
//     e.g. UcxAgentOptions::remote_gather off): whole source blocks are read into a staging
//     region of this rank (one agent read per chunk of blocks that fits it, runs coalesced),
//     and the piece's heads are scattered from there into the pool (reshard.h, memcpy).
// Never one transfer per token or per head: the descriptors of a read are at most (source
// ranks of the plan) x (contiguous runs) per staging chunk. When a staged source rank holds more
// heads than this rank needs (P tp < D tp) whole blocks still move, so that direction reads
// (source heads / needed heads) times the bytes it keeps.
//
// Staged reads need a host pool (RankKvReaderOptions::pool); into a device pool only direct
// and strided plans are possible (AddSource says UNIMPLEMENTED otherwise). Quantized KV
// (scales inside the block) is read direct only.
//
// Staged chunks are polled, scattered and re-posted by the reader's own staging thread (started
// with the staging region), never on the caller's: a scatter of tens of MiB must not stall the
// engine's step loop. Two staging slots let one chunk arrive while the other is scattered.
//
// Thread safety: thread-safe (one mutex; scatters run without it, on the staging thread).
#ifndef TANDEM_KVTRANSFER_RANK_READER_H_
#define TANDEM_KVTRANSFER_RANK_READER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/block_transport.h"
#include "kvtransfer/reshard.h"
#include "kvtransfer/transfer_agent.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

struct RankKvReaderOptions {
  tandem::v1::CompatibilityInfo compatibility;  // the layout every rank of every group shares
  tandem::v1::RankGeometry geometry;            // this rank's share (proto3 zeros: one rank)
  uint32_t pool_region = 0;                     // this rank's pool in its agent's regions
  // The pool's host address (staged reads scatter into it); null for a device pool.
  char* pool = nullptr;
  int64_t pool_blocks = 0;
  // Staging for re-sharded reads, allocated from the agent at the first source that needs it;
  // must hold at least one source block.
  uint64_t staging_bytes = uint64_t{64} << 20;
  // Use the agent's strided reads where it offers them (TransferAgent::CanReadStrided); false:
  // stage every re-shard (rank_reader_bench compares the two).
  bool strided_reads = true;
};

struct RankKvReaderStats {
  uint64_t reads = 0;        // PostRead calls that posted something
  uint64_t agent_reads = 0;  // agent PostRead calls (transfers on the wire)
  uint64_t copy_ops = 0;     // descriptors in them (contiguous runs)
  uint64_t bytes_read = 0;   // bytes the agent moved for completed pieces
  uint64_t bytes_kept = 0;   // bytes that landed in the pool (the heads this rank holds)
};

class RankKvReader final : public BlockTransport {
 public:
  // `agent` must outlive the reader and have the pool registered as options.pool_region.
  RankKvReader(TransferAgent* agent, RankKvReaderOptions options);
  ~RankKvReader() override;

  // Links (or re-links, e.g. a restarted source) `peer`, whose handshake has passed
  // CheckCompatible: connects the agent to the source ranks that hold this rank's heads.
  // INVALID_ARGUMENT when no source rank holds some head, UNIMPLEMENTED for a staged plan into a
  // device pool or of quantized KV, the agent's errors.
  absl::Status AddSource(const std::string& peer, const tandem::v1::TransferHandshake& source);

  absl::StatusOr<TransferId> PostRead(
      const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) override;
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  absl::Status SyncForRemoteRead(absl::Span<const int32_t> block_ids) override;

  // Whether `peer` is linked and no read from it has failed UNAVAILABLE since (its connection
  // is gone: the next handshake must link it again).
  bool SourceLinked(const std::string& peer) const;
  RankKvReaderStats stats() const;
  // The agent peer name of rank `rank` of source `peer` (`peer` itself for a single rank).
  static std::string RankPeerName(const std::string& peer, int rank, int group_size);

 private:
  struct Source {
    std::vector<std::string> agent_peers;  // per source rank
    std::vector<BlockShape> shapes;        // per source rank
    std::vector<RankHeads> heads;          // per source rank
    std::vector<uint64_t> block_bytes;     // per source rank
    std::vector<ReshardPiece> plan;        // this rank's heads, by source rank
    std::vector<bool> direct;              // per piece
    std::vector<bool> strided;             // per piece
    // A data-parallel attention group (RankGeometry.dp_size): every rank holds every head of its
    // own blocks, block x on rank x % dp_size at x / dp_size; `plan` names rank 0 and each read
    // runs it once per source rank holding some of its blocks.
    int dp_size = 1;
  };
  struct Part {
    ReshardPiece piece;
    // The (source block on the piece's rank, local block) pairs it moves: the read's, or under a
    // data-parallel source its source rank's share.
    std::vector<std::pair<int32_t, int32_t>> blocks;
    bool direct = false;
    bool strided = false;  // one strided agent read, posted like a direct one
    std::string agent_peer;
    BlockShape src_shape;
    int src_head_begin = 0;
    uint64_t src_block_bytes = 0;
    std::optional<TransferId> inflight;  // direct / strided: the whole read
    uint64_t bytes = 0;                  // direct / strided: its bytes
    size_t posted = 0;                   // staged: blocks [0, posted) are read or being read
    size_t done = 0;                     // staged: blocks scattered into the pool
    bool finished = false;  // all its blocks arrived (direct) or were scattered (staged)
  };
  struct Read {
    std::string peer;
    std::vector<Part> parts;
    absl::Status error;  // first failure (or CANCELLED); OK while fine
    int chunks = 0;      // staged chunks of this read in flight or being scattered
  };
  // A staged chunk: blocks [begin, end) of a part, read into staging slot `slot`.
  struct Chunk {
    TransferId read = 0;
    size_t part = 0;
    size_t begin = 0, end = 0;
    int slot = 0;
    std::optional<TransferId> agent_id;  // unset once the read ended
    bool scattering = false;
    uint64_t bytes = 0;
  };

  // AddSource's steps. The source's per-rank peers, shapes and re-sharding plan (no lock).
  absl::StatusOr<Source> PlanSource(
      const std::string& peer,
      const std::vector<const tandem::v1::TransferHandshake*>& ranks) const;
  // Links the agent to every `needed` rank of the source.
  absl::Status AddRankPeersLocked(const std::string& peer, const Source& s,
                                  const std::vector<const tandem::v1::TransferHandshake*>& ranks,
                                  const std::vector<bool>& needed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills s.direct and s.strided per piece; returns whether some piece must be staged.
  bool ChooseReadFormsLocked(Source& s, const std::vector<bool>& needed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNIMPLEMENTED: a source of `source_ranks` ranks whose pieces this reader cannot stage.
  absl::Status ReshardRefused(const std::string& peer, int source_ranks) const;
  // Creates the staging region; INVALID_ARGUMENT when a slot holds no block of `s`.
  absl::Status CheckStagingFitsLocked(const Source& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts a direct or strided part: one agent read.
  absl::Status PostDirectLocked(Part& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the direct parts' agent reads (the caller's thread).
  void ProgressDirectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The staging thread: polls staged chunks, scatters the arrived ones (without the lock),
  // posts the next chunks into free slots.
  void StagingLoop();
  void FillSlotsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ScatterChunk(const Part& part, const Chunk& chunk);
  void FailLocked(Read& read, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Ended(const Read& read);
  BlockShape LocalShape() const;

  TransferAgent* const agent_;
  const RankKvReaderOptions options_;
  const RankHeads mine_;
  const int64_t head_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Source> sources_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> unreachable_ ABSL_GUARDED_BY(mu_);  // see SourceLinked
  absl::flat_hash_map<TransferId, Read> reads_ ABSL_GUARDED_BY(mu_);
  TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The staging region, two slots of half its size, so one chunk arrives while the other is
  // scattered; parts wait for them in FIFO order.
  static constexpr int kSlots = 2;
  std::vector<char> staging_heap_ ABSL_GUARDED_BY(mu_);
  char* staging_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t staging_region_ ABSL_GUARDED_BY(mu_) = 0;
  bool slot_busy_[kSlots] ABSL_GUARDED_BY(mu_) = {};
  std::deque<std::pair<TransferId, size_t>> staging_queue_ ABSL_GUARDED_BY(mu_);  // (read, part)
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread staging_thread_;  // started with the staging region
  RankKvReaderStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_RANK_READER_H_
