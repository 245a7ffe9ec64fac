// KV transfer for worker groups (tensor parallelism across ranks, issue "P and D of different TP
// sizes exchange KV in bulk"; ARCHITECTURE.md "Worker groups"):
//
//  * RankKvEndpoint, on EVERY rank (rank 0 included): the rank's transfer agent, its pool (the
//    KV heads it holds) and its RankKvReader (kvtransfer/rank_reader.h). It answers rank 0's
//    KvCommands (tandem.v1.KvCommand in rank_plan.proto): describe (its descriptor + geometry,
//    gathered into the group's handshake), link a source, post / cancel / poll reads, make
//    blocks readable. Followers plug it into RunFollower (RankKvHooks).
//  * GroupBlockTransport, on rank 0: the connector's BlockTransport for the whole group. A read
//    is fanned out to every rank (each pulls its own heads from the source ranks that hold
//    them; in a DCP group, only for the blocks of its KV shard); it has ended when every rank's
//    part has ended, and failed if any part failed (the other parts are cancelled). Rank 0's
//    connector keeps all the bookkeeping (leases, renewal, deadlines), exactly as for a single
//    rank.
//
// Polling: CheckTransfer polls the group (one broadcast + gather) at most every `poll_interval`
// and answers from the last poll otherwise.
//
// Thread safety: both are thread-safe. GroupBlockTransport's group calls go through the
// GroupChannel, serialized with the steps.
#ifndef TANDEM_RUNTIME_PARALLEL_GROUP_KV_H_
#define TANDEM_RUNTIME_PARALLEL_GROUP_KV_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/block_transport.h"
#include "kvtransfer/rank_reader.h"
#include "kvtransfer/transfer_agent.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/model_config.h"
#include "runtime/parallel/group_channel.h"
#include "runtime/parallel/group_executor.h"
#include "tandem/v1/kv.pb.h"
#include "tandem/v1/rank_plan.pb.h"

namespace tandem::runtime {

struct RankKvEndpointOptions {
  ModelConfig model;  // the whole model (not the rank's share)
  KvDtype kv_dtype = KvDtype::kF32;
  int tp_rank = 0;
  int tp_size = 1;
  // Decode context parallelism (runtime/kv_cache/dcp_blocks.h): this rank holds KV shard
  // tp_rank % dcp_size; interleave 0 = the block size. A group read then lands on this rank only
  // for the blocks its shard holds (group-wide block ids x with x % dcp_size == shard, at local
  // block x / dcp_size): each rank reads exactly its shard's blocks.
  int dcp_size = 1;
  int64_t dcp_interleave = 0;
  // Data-parallel attention (--dp_attention; runtime/engine/dp_rank.h): this rank holds every KV
  // head of its own requests' blocks (group-wide block id x on rank x % dp_size, at local block
  // x / dp_size): a group read lands only on the rank holding the blocks, which reads all heads.
  int dp_size = 1;
  uint64_t staging_bytes = uint64_t{64} << 20;  // RankKvReaderOptions::staging_bytes
};

class RankKvEndpoint final : public RankKvHooks {
 public:
  // `agent` must outlive the endpoint.
  RankKvEndpoint(kvtransfer::TransferAgent* agent, RankKvEndpointOptions options);

  // RankKvHooks: the pool from the agent where it can share it best; registered otherwise.
  absl::StatusOr<void*> AllocatePool(int64_t bytes) override;
  absl::Status PoolReady(ModelExecutor& executor, const ExecutorSpec& spec) override;
  std::string Handle(const tandem::v1::KvCommand& command) override;
  // The same for rank 0's engine, whose pool the worker daemon placed: `region` is the pool's
  // agent region, `pool` its host address (null on a device).
  absl::Status AttachPool(uint32_t region, char* pool, int64_t num_blocks, int64_t block_size,
                          int64_t pool_bytes);

  tandem::v1::KvReply HandleCommand(const tandem::v1::KvCommand& command);
  // This rank's share: its geometry and layout (after the pool is attached).
  tandem::v1::RankGeometry geometry() const;
  tandem::v1::CompatibilityInfo layout() const;
  // Null until the pool is attached.
  kvtransfer::RankKvReader* reader();

 private:
  // `read`'s (source, local) block pairs that land on this rank (DCP: its shard's, as local ids).
  std::vector<std::pair<int32_t, int32_t>> ShardBlocks(const tandem::v1::KvRead& read) const;

  kvtransfer::TransferAgent* const agent_;
  const RankKvEndpointOptions options_;
  mutable absl::Mutex mu_;
  std::optional<uint32_t> allocated_region_ ABSL_GUARDED_BY(mu_);
  tandem::v1::RankGeometry geometry_ ABSL_GUARDED_BY(mu_);
  tandem::v1::CompatibilityInfo layout_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<kvtransfer::RankKvReader> reader_ ABSL_GUARDED_BY(mu_);
  // Group read id -> this rank's read, and the ends not yet reported.
  absl::flat_hash_map<uint64_t, kvtransfer::TransferId> reads_ ABSL_GUARDED_BY(mu_);
  std::vector<tandem::v1::KvReadEnd> ended_ ABSL_GUARDED_BY(mu_);
};

// The KV facts every rank states the same way: the layout part of CompatibilityInfo (model id
// and dtype are the worker's to fill).
tandem::v1::CompatibilityInfo KvLayoutInfo(const ModelConfig& model, int64_t block_size,
                                           KvDtype kv_dtype);

struct GroupKvStats {
  std::vector<uint64_t> bytes_read;  // per rank: bytes its agent moved
  std::vector<uint64_t> bytes_kept;  // per rank: bytes that landed in its pool
  std::vector<uint64_t> copy_ops;    // per rank: descriptors posted
};

class GroupBlockTransport final : public kvtransfer::BlockTransport {
 public:
  // `local` is rank 0's endpoint; both must outlive the transport.
  GroupBlockTransport(std::shared_ptr<GroupChannel> channel, RankKvEndpoint* local,
                      absl::Duration poll_interval = absl::Microseconds(500));

  // Every rank's descriptor and geometry, rank order (for TransferHandshake.ranks).
  absl::StatusOr<std::vector<tandem::v1::TransferHandshake>> DescribeRanks();
  // Links `peer` on every rank (each connects to the source ranks holding its heads).
  absl::Status AddSource(const std::string& peer, const tandem::v1::TransferHandshake& source);

  absl::StatusOr<kvtransfer::TransferId> PostRead(
      const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) override;
  absl::StatusOr<bool> CheckTransfer(kvtransfer::TransferId id) override;
  void Cancel(kvtransfer::TransferId id) override;
  absl::Status SyncForRemoteRead(absl::Span<const int32_t> block_ids) override;

  GroupKvStats stats() const;
  // As RankKvReader::SourceLinked, over every rank: false once a read from `peer` failed
  // UNAVAILABLE on any rank, until it is linked again.
  bool SourceLinked(const std::string& peer) const;

 private:
  struct Read {
    std::string peer;
    std::vector<bool> ended;  // per rank
    absl::Status status;      // first failure
    bool cancel_sent = false;
  };
  // One command to every rank; the replies, or the group's failure.
  absl::StatusOr<std::vector<tandem::v1::KvReply>> Call(const tandem::v1::KvCommand& command);
  // Polls every rank, folds the ends into reads_, cancels reads that failed somewhere.
  absl::Status PollLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEndsLocked(const std::vector<tandem::v1::KvReply>& replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<GroupChannel> channel_;
  RankKvEndpoint* const local_;
  const absl::Duration poll_interval_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<kvtransfer::TransferId, Read> reads_ ABSL_GUARDED_BY(mu_);
  kvtransfer::TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_poll_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // the group failed: every read ends with it
  GroupKvStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> linked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_GROUP_KV_H_
