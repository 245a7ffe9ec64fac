// Decode context parallelism's block arithmetic (ARCHITECTURE.md, "Decode context parallelism"):
// which of the KVP shards holds a request's logical block i, and how many blocks a request of n
// tokens needs on each shard. The kernels' token arithmetic (kernels/attention/dcp_shard.h) says
// where a TOKEN lives; this says where a BLOCK of the scheduler's block table lives.
//
// A request's block table stays one list (logical block i -> block id). Block ids are global over
// the group: id x lives on shard x % size at the shard's local block x / size, so the KV-cache
// manager keeps one id space and each rank maps its own ids to its pool. Logical blocks are
// ordered by the first global token they hold:
//   * interleave a multiple of block_size (c = interleave / block_size blocks per unit, the
//     default c = 1): logical block i holds global tokens [i*bs, (i+1)*bs) and lives on shard
//     (i / c) % size; the block tables of P (no DCP) and D agree block for block, so P->D moves
//     whole blocks and prefix-cache hashes are the ordinary chained ones;
//   * interleave dividing block_size: local block j of shard k is logical block j*size + k (its
//     tokens are spread over the context: no prefix caching, no P->D of whole blocks).
// Either way the blocks a request of n tokens needs are exactly logical blocks [0, NumBlocks(n)):
// shards fill in order, so the table only grows at its end.
//
// Thread safety: plain values and pure functions.
#ifndef TANDEM_RUNTIME_KV_CACHE_DCP_BLOCKS_H_
#define TANDEM_RUNTIME_KV_CACHE_DCP_BLOCKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention/dcp_shard.h"

namespace tandem::runtime {

struct DcpBlockLayout {
  int64_t size = 1;        // KVP: KV shards (1 = no context parallelism)
  int64_t interleave = 1;  // tokens per unit dealt to a shard
  int64_t block_size = 16;

  // The placement of the --dcp / --dcp_interleave flags: the one place "interleave 0 means the
  // block size" is read. Every DcpBlockLayout / kernels::DcpShard is built from it (engine, KV
  // manager, CPU and CUDA runners, the rank's KV endpoint), so they cannot disagree.
  static DcpBlockLayout FromFlags(int64_t dcp_size, int64_t dcp_interleave, int64_t block_size) {
    return {dcp_size, dcp_interleave == 0 ? block_size : dcp_interleave, block_size};
  }

  // INVALID_ARGUMENT naming the numbers unless size >= 1, block_size >= 1, interleave >= 1 and
  // interleave is a multiple of block_size or divides it (size 1: anything goes).
  absl::Status Validate() const;

  // True when logical blocks hold consecutive global tokens (size 1, or interleave a multiple of
  // block_size): prefix caching and whole-block P->D work.
  bool WholeBlocks() const { return size == 1 || interleave % block_size == 0; }
  // The shard holding logical block i.
  int64_t ShardOfBlock(int64_t i) const;
  // Logical blocks of a request of `num_tokens` tokens (over all shards).
  int64_t NumBlocks(int64_t num_tokens) const;
  // Of those, the blocks on `shard`.
  int64_t NumShardBlocks(int64_t num_tokens, int64_t shard) const;
  // The blocks of a request's `table` (group-wide ids, logical order) that `shard` holds, in
  // order, as that rank's local ids (x / size), written through the output iterator `out`.
  template <typename OutputIt>
  void ShardLocalBlocks(absl::Span<const int32_t> table, int64_t shard, OutputIt out) const {
    for (size_t i = 0; i < table.size(); ++i) {
      if (ShardOfBlock(static_cast<int64_t>(i)) == shard) {
        *out++ = static_cast<int32_t>(LocalId(table[i]));
      }
    }
  }
  // The kernels' view of shard `rank`.
  kernels::DcpShard Shard(int64_t rank) const { return {size, rank, interleave}; }
  // The shard tensor-parallel rank `tp_rank` holds (kernels::DcpShardOfTpRank), and its view.
  int64_t ShardOfTpRank(int64_t tp_rank) const { return kernels::DcpShardOfTpRank(tp_rank, size); }
  kernels::DcpShard ShardForTpRank(int64_t tp_rank) const { return Shard(ShardOfTpRank(tp_rank)); }
  // Group-wide block id x: on shard x % size, at that shard's local block x / size.
  int64_t ShardOfId(int64_t id) const { return id % size; }
  int64_t LocalId(int64_t id) const { return id / size; }
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_KV_CACHE_DCP_BLOCKS_H_
