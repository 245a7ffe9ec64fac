// Re-sharding KV between tensor-parallel groups of different sizes (P TP=a -> D TP=b): which
// source rank serves which KV heads of a destination rank, and the bulk gather / scatter that
// turns a head slice of many blocks into ONE contiguous staging region per (source rank,
// destination rank) pair, so the transfer is one descriptor per region — never one RDMA per
// token or per head.
//
// Pool layout: "block_major_v1" (proto/tandem/v1/kv.proto), per rank
// [num_blocks][num_layers][2 (K,V)][block_size][local kv heads][head_dim]; a head slice of one
// block is 2 * num_layers * block_size strided runs, hence the staging. Staging layout:
// [block (request order)][layer][K,V][token][head_count][head_dim] — the same for the source's
// gather and the destination's scatter. Quantized pools (scales after a block's values) are
// refused: their scales would need re-sharding too.
//
// Equal geometry (rank r reads rank r's whole pool share) needs no staging: IsDirect(). Where the
// transport copies strided rows itself (TransferAgent::CanReadStrided), a head slice moves in one
// pass too: StridedHeadOps, one strided descriptor per run of blocks, no staging.
//
// Thread safety: pure functions.
#ifndef TANDEM_KVTRANSFER_RESHARD_H_
#define TANDEM_KVTRANSFER_RESHARD_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

// The KV heads a rank's pool holds (RankGeometry.kv_head_begin / kv_head_count).
struct RankHeads {
  int head_begin = 0;
  int head_count = 0;
};

// Heads [head_begin, head_begin + head_count) of a destination rank, served by `src_rank`.
struct ReshardPiece {
  int src_rank = 0;
  int head_begin = 0;  // global KV head
  int head_count = 0;
};

// Every head of `dst` from exactly one source rank holding it; consecutive heads from the same
// source rank form one piece. Where several source ranks hold a head (KV heads replicated over
// a larger TP), the destination rank `dst_rank` takes replica dst_rank % replicas, so readers
// spread over the replicas. INVALID_ARGUMENT when some head of dst is held by no source rank.
absl::StatusOr<std::vector<ReshardPiece>> PlanReshard(absl::Span<const RankHeads> src,
                                                      RankHeads dst, int dst_rank);

// The piece is the source rank's whole share and the destination's whole share: blocks move as
// they are (no staging).
bool IsDirect(const ReshardPiece& piece, const RankHeads& src, const RankHeads& dst);

// One rank's pool geometry in bytes.
struct BlockShape {
  int64_t num_layers = 0;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;  // this rank's (local) heads
  int64_t head_bytes = 0;    // head_dim * element bytes
  int64_t BlockBytes() const { return num_layers * 2 * block_size * num_kv_heads * head_bytes; }
};

// Bytes of the staging region of `num_blocks` blocks x `head_count` heads.
int64_t StagingBytes(const BlockShape& shape, int64_t num_blocks, int head_count);

// Source side: heads [local_head_begin, + head_count) of `blocks` (physical ids in `pool`, in
// request order) into `staging` (StagingBytes). INVALID_ARGUMENT for heads or blocks outside the
// pool (`pool_blocks` blocks) or a staging region of another size.
absl::Status GatherHeads(const char* pool, const BlockShape& shape, int64_t pool_blocks,
                         absl::Span<const int32_t> blocks, int local_head_begin, int head_count,
                         char* staging, int64_t staging_bytes);

// Destination side: the inverse, into heads [local_head_begin, + head_count) of `blocks`.
absl::Status ScatterHeads(const char* staging, int64_t staging_bytes, char* pool,
                          const BlockShape& shape, int64_t pool_blocks,
                          absl::Span<const int32_t> blocks, int local_head_begin, int head_count);

// Strided copies moving heads [src_local_head, + head_count) of source blocks (shape `src`, in
// remote region `remote_region`) into heads [dst_local_head, + head_count) of destination blocks
// (shape `dst`, local region `local_region`), for each (source block, destination block) pair of
// `blocks`. A row is one token's heads of one (layer, K|V); one op per block pair, and pairs
// that continue each other on both sides coalesce into one op (so a run of blocks is one
// descriptor). Unquantized pools; REQUIRES: the heads inside both shapes, ids >= 0.
std::vector<StridedCopyOp> StridedHeadOps(absl::Span<const std::pair<int32_t, int32_t>> blocks,
                                          const BlockShape& src, int src_local_head,
                                          const BlockShape& dst, int dst_local_head, int head_count,
                                          uint32_t local_region, uint32_t remote_region);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_RESHARD_H_
