// BlockTransport: what the pull connector (pull_connector.h) needs to move a request's KV
// blocks, in blocks rather than bytes, so that one connector serves a single rank (its agent,
// AgentBlockTransport) as well as a worker group (every rank reads the heads it holds:
// rank_reader.h, and runtime/parallel/group_kv.h fans a read out to the ranks).
//
// Contract: the TransferAgent's (transfer_agent.h): a read is ended when CheckTransfer returns
// anything but `false`; only then is nothing written into its local blocks any more; an ended
// id is forgotten. Nothing blocks on the network.
//
// Thread safety: implementations are thread-safe.
#ifndef TANDEM_KVTRANSFER_BLOCK_TRANSPORT_H_
#define TANDEM_KVTRANSFER_BLOCK_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

class BlockTransport {
 public:
  virtual ~BlockTransport() = default;
  // One read of `blocks` ((source block, local block) pairs, the request's logical order) from
  // the source linked as `peer`. NOT_FOUND for an unlinked peer, INVALID_ARGUMENT for an empty
  // list, OUT_OF_RANGE for a block outside a pool.
  virtual absl::StatusOr<TransferId> PostRead(
      const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) = 0;
  virtual absl::StatusOr<bool> CheckTransfer(TransferId id) = 0;
  virtual void Cancel(TransferId id) = 0;
  // Source side: makes `block_ids` of the local pool readable by peers (TransferAgent::
  // SyncForRemoteRead over their byte ranges, on every rank of a group).
  virtual absl::Status SyncForRemoteRead(absl::Span<const int32_t> block_ids) = 0;
};

// Block ids -> byte ranges of whole blocks (`block_bytes` each), runs of consecutive ids
// coalesced.
std::vector<ByteRange> BlocksToByteRanges(absl::Span<const int32_t> block_ids,
                                          uint64_t block_bytes);

// (source, local) block pairs -> CopyOps of whole blocks: consecutive pairs whose source and
// local ids both increase by one become one op.
std::vector<CopyOp> BlockPairsToCopyOps(absl::Span<const std::pair<int32_t, int32_t>> blocks,
                                        uint32_t local_region, uint32_t remote_region,
                                        uint64_t block_bytes);

// One rank reading whole blocks from a peer of the same geometry through its agent (what a
// single-rank worker did before groups existed; tests).
class AgentBlockTransport final : public BlockTransport {
 public:
  // `agent` must outlive this object.
  AgentBlockTransport(TransferAgent* agent, uint32_t local_region, uint32_t remote_region,
                      uint64_t block_bytes)
      : agent_(agent),
        local_region_(local_region),
        remote_region_(remote_region),
        block_bytes_(block_bytes) {}
  absl::StatusOr<TransferId> PostRead(
      const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) override {
    return agent_->PostRead(
        peer, BlockPairsToCopyOps(blocks, local_region_, remote_region_, block_bytes_));
  }
  absl::StatusOr<bool> CheckTransfer(TransferId id) override { return agent_->CheckTransfer(id); }
  void Cancel(TransferId id) override { agent_->Cancel(id); }
  absl::Status SyncForRemoteRead(absl::Span<const int32_t> block_ids) override {
    if (block_ids.empty() || block_bytes_ == 0) return absl::OkStatus();
    return agent_->SyncForRemoteRead(local_region_, BlocksToByteRanges(block_ids, block_bytes_));
  }

 private:
  TransferAgent* const agent_;
  const uint32_t local_region_;
  const uint32_t remote_region_;
  const uint64_t block_bytes_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_BLOCK_TRANSPORT_H_
