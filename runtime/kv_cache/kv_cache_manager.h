// KvCacheManager: the bookkeeping half of the paged KV cache (ARCHITECTURE.md, "KV cache"). It
// never touches device memory: it hands out physical block ids, counts who references each block,
// and remembers which full blocks hold which token prefix (the prefix cache). The scheduler turns
// block tables into slot mappings; the runner writes and reads the KV at those slots.
//
// Model:
//  * A pool of num_blocks blocks of block_size tokens each, ids [0, num_blocks).
//  * Each request owns a block table (logical block i -> physical block id) covering its first
//    tokens. Tables only grow (append-only) until Free(); entries never change, so slots the
//    runner already wrote stay valid.
//  * Each block has a ref count = the number of block tables containing it. Requests sharing a
//    cached prefix share its physical blocks.
//  * A full block can be "cached": registered under the chained hash of the prefix it completes
//    (common/block_hash.h), so a later request with the same prefix (and salt) reuses it instead
//    of recomputing it. Only the block that registered a hash first maps from it; a duplicate
//    computed concurrently by another request stays uncached.
//  * Blocks with ref count 0 are free and sit in an LRU queue (free_block_queue.h). A free block
//    may still be cached: it keeps its hash until it is handed out again (evicted). Allocation
//    takes the queue's head; Free() appends to the tail, a request's blocks in reverse table
//    order so a chain's tail block is evicted before its prefix. A prefix hit on a free cached
//    block takes it out of the queue again ("revives" it).
//
// Ask, then act (as nano-vllm's block manager): the scheduler asks NumBlocksNeeded() and compares
// with NumFreeBlocks() to decide whom to run or preempt; Allocate() then either succeeds or
// changes nothing. Policy (preemption, admission) stays in the scheduler.
//
// Typical step for a request:
//   PrefixMatch hit = kv.FindCachedPrefix(prompt, salt, /*record_stats=*/true);  // new requests
//   if (kv.NumBlocksNeeded(id, num_tokens, &hit) <= kv.NumFreeBlocks())
//     kv.Allocate(id, num_tokens, &hit);       // num_computed_tokens starts at hit.num_tokens
//   ... run the model ...
//   kv.CacheBlocks(id, all_tokens, salt, num_computed_tokens);
//   ... when finished or preempted: kv.Free(id);
//
// Thread safety: NOT thread-safe. One KvCacheManager is owned and called by the scheduler thread
// only; nothing here locks.
#ifndef TANDEM_RUNTIME_KV_CACHE_KV_CACHE_MANAGER_H_
#define TANDEM_RUNTIME_KV_CACHE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "runtime/kv_cache/dcp_blocks.h"
#include "runtime/kv_cache/free_block_queue.h"

namespace tandem::runtime {

// BlockId (a physical block index in [0, num_blocks)) comes from free_block_queue.h.

struct KvCacheConfig {
  int64_t num_blocks = 0;   // >= 1; fewer than INT32_MAX; over all DCP shards
  int64_t block_size = 16;  // tokens per block, >= 1
  bool enable_prefix_caching = true;
  // Decode context parallelism (dcp_blocks.h): the pool is dcp_size shards of num_blocks /
  // dcp_size blocks each (block id x on shard x % dcp_size); logical block i of every request
  // comes from shard DcpBlockLayout::ShardOfBlock(i). dcp_interleave 0 = block_size. Prefix
  // caching needs whole blocks (DcpBlockLayout::WholeBlocks()); it is off otherwise.
  int64_t dcp_size = 1;
  int64_t dcp_interleave = 0;
  // Data-parallel attention (--dp_attention): the pool is dp_size DP ranks' pools of num_blocks /
  // dp_size blocks each, block id x on DP rank x % dp_size at that rank's local block
  // x / dp_size (DCP's id arithmetic); a request's blocks all come from its DP rank's pool
  // (Allocate's dp_rank), and prefix hits stop at a block of another rank. Not with dcp_size > 1.
  int64_t dp_size = 1;
};

// Blocks that fit a byte budget: floor(budget_bytes / block_bytes). INVALID_ARGUMENT when
// block_bytes <= 0, budget_bytes < 0, or the budget holds less than one block.
absl::StatusOr<int64_t> NumBlocksForBudget(int64_t budget_bytes, int64_t block_bytes);

// Result of a prefix-cache lookup: the physical blocks holding the request's leading full
// blocks, in order. num_tokens = blocks.size() * block_size.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  int64_t num_tokens = 0;
};

struct KvCacheStats {
  int64_t num_blocks = 0;
  int64_t num_free_blocks = 0;        // ref count 0: allocatable, cached or not
  int64_t num_cached_blocks = 0;      // have a hash (in use or free)
  int64_t prefix_queried_tokens = 0;  // sum of tokens.size() over recorded lookups
  int64_t prefix_hit_tokens = 0;      // sum of PrefixMatch::num_tokens over recorded lookups
  std::vector<int64_t> free_blocks_per_shard;  // [dcp_size]

  double Usage() const;    // 1 - free / total (0 for an empty pool)
  double HitRate() const;  // hit / queried (0 when nothing was queried)
};

class KvCacheManager {
 public:
  // INVALID_ARGUMENT for num_blocks outside [1, INT32_MAX), block_size < 1, or a DCP layout that
  // DcpBlockLayout::Validate refuses or num_blocks not a multiple of dcp_size.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const KvCacheConfig& config);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  const DcpBlockLayout& dcp() const { return dcp_; }

  // Longest run of leading FULL blocks of `tokens` present in the prefix cache (chain seeded with
  // `salt`), capped so that at least one token remains to compute (the model must run on at
  // least one token to produce logits): at most (tokens.size() - 1) / block_size blocks. Hashes
  // block by block and stops at the first miss. Adds to the query/hit stats only when
  // record_stats (so a request that is looked up every step until it is admitted counts once).
  // No other side effect: takes no references, so the result is only valid until the next call
  // that allocates; use it in the same scheduling step. Empty when prefix caching is disabled.
  // With dp_size > 1: only blocks of DP rank `dp_rank`'s pool match.
  PrefixMatch FindCachedPrefix(absl::Span<const int32_t> tokens, absl::string_view salt,
                               bool record_stats, int64_t dp_rank = 0);

  // Free blocks that Allocate(request_id, num_tokens, prefix) would consume: new blocks, plus
  // prefix blocks that are currently free (taking them removes them from the free queue).
  // `prefix` matters only while request_id owns no blocks (its first allocation); may be null.
  int64_t NumBlocksNeeded(int64_t request_id, int64_t num_tokens, const PrefixMatch* prefix) const;

  // Ensures request_id owns blocks for its first num_tokens tokens (dcp().NumBlocks(num_tokens):
  // ceil(num_tokens / block_size) without DCP; never shrinks a table), logical block i from shard
  // dcp().ShardOfBlock(i). On the request's first allocation (it owns no blocks yet),
  // the `prefix` blocks from FindCachedPrefix in the same step become the head of its table
  // (ref_count++; a block with ref 0 leaves the free queue) and `prefix` is ignored afterwards.
  // New blocks come from the head of their shard's free queue (least recently used), losing their
  // old hash. Returns false and changes NOTHING when free blocks are insufficient (on any shard).
  // Also returns false, changing nothing, when `prefix` is stale (a block id out of range or no
  // longer cached; i.e. FindCachedPrefix was not called in the same step). num_tokens <= 0
  // allocates nothing.
  // With dp_size > 1 every block comes from DP rank `dp_rank`'s pool (false, changing nothing,
  // when that pool lacks room or dp_rank is out of range); a request keeps one DP rank.
  bool Allocate(int64_t request_id, int64_t num_tokens, const PrefixMatch* prefix,
                int64_t dp_rank = 0);

  // Registers the hashes of request_id's full blocks among tokens[0, num_tokens) so later
  // requests can share them. `tokens` is the request's prompt + output so far. Call it once the
  // KV of tokens[0, num_tokens) is computed (after the step), so a failed step or KV load never
  // leaves a registered block holding bad KV: a registered hash outlives the request. Only
  // blocks the request owns are registered
  // (num_tokens is clamped to the table and to tokens.size()). Idempotent and incremental: the
  // request keeps its chain of hashes, so each call hashes only newly completed blocks. Blocks
  // already hashed (e.g. shared prefix blocks) are skipped; when another block already holds the
  // same hash, the existing mapping stays and this duplicate stays uncached.
  // REQUIRES: the same tokens and salt on every call for one request. No-op for unknown requests
  // or when prefix caching is disabled.
  void CacheBlocks(int64_t request_id, absl::Span<const int32_t> tokens, absl::string_view salt,
                   int64_t num_tokens);

  // Releases every block of request_id (ref_count--) and forgets the request. Blocks reaching 0
  // are appended to the free queue's tail in REVERSE block-table order, so eviction (from the
  // head) takes a chain's tail blocks first; cached blocks stay reusable until evicted.
  // Unknown request: no-op.
  void Free(int64_t request_id);

  // request_id's block table (logical -> physical), empty for an unknown request. The span is
  // invalidated by the next Allocate, CacheBlocks or Free call.
  absl::Span<const BlockId> BlockTable(int64_t request_id) const;

  // Free blocks over all shards, and on one.
  int64_t NumFreeBlocks() const;
  int64_t NumFreeBlocksOnShard(int64_t shard) const { return free_queues_[shard].size(); }
  // Data-parallel attention: DP ranks' pools (1 without) and one rank's free blocks.
  int64_t dp_size() const { return dp_size_; }
  int64_t NumFreeBlocksOnDpRank(int64_t dp_rank) const { return free_queues_[dp_rank].size(); }

  // Prefix-cache change log for an approximate remote index (the router's): when enabled, every
  // newly registered hash and every evicted one is recorded (short form) until taken. Off by
  // default. TakeCacheEvents replaces *added / *removed with the events since the last call.
  void EnableCacheEvents(bool enable);
  // Short hashes of every block in the prefix cache now (in use or free).
  std::vector<uint64_t> CachedHashesShort() const;
  void TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed);
  KvCacheStats Stats() const;

  // Checks every internal invariant: ref counts equal table membership, free queue = blocks with
  // ref 0 (links consistent), hash map <-> per-block hashes consistent, per-request hash chains
  // agree with cached blocks. INTERNAL naming the first violation. O(num_blocks + table sizes);
  // for tests and debugging.
  absl::Status CheckInvariants() const;

 private:
  struct Block {
    BlockHash hash;  // meaningful iff cached
    int32_t ref_count = 0;
    bool cached = false;  // then cached_blocks_[hash] == this block's id
  };

  struct RequestBlocks {
    std::vector<BlockId> block_table;
    // Chained hashes of the first block_hashes.size() full blocks of this request (from shared
    // prefix blocks or computed by CacheBlocks). Kept for blocks left uncached as duplicates too:
    // the next block's hash chains from them.
    std::vector<BlockHash> block_hashes;
  };

  explicit KvCacheManager(const KvCacheConfig& config);

  // True when `prefix` is usable now (ids in range, all still cached); then *num_free is how
  // many of its blocks are free (ref 0) and would leave the free queue.
  bool ValidPrefix(const PrefixMatch& prefix, int64_t* num_free) const;
  // Takes the head of `shard`'s queue for a new owner, dropping any cached hash it still had.
  BlockId TakeFreeBlock(int64_t pool);
  // The free queues hold each pool's local ids (id / num_pools_): DCP shards or DP ranks.
  bool IsFree(BlockId id) const;
  void PushFree(BlockId id);
  void RemoveFree(BlockId id);
  // Blocks `request` would take from each shard (DP: from dp_rank's pool) to own logical blocks
  // [owned, wanted), plus the free blocks among `prefix` (nullable); true when all are there.
  bool ShardsHaveRoom(int64_t owned, int64_t wanted, const PrefixMatch* prefix,
                      int64_t dp_rank) const;

  const int64_t block_size_;
  const DcpBlockLayout dcp_;
  const int64_t dp_size_;
  const int64_t num_pools_;  // dcp_.size * dp_size_ (one of them is 1)
  const bool enable_prefix_caching_;
  std::vector<Block> blocks_;                // [num_blocks]
  std::vector<FreeBlockQueue> free_queues_;  // [num_pools_], of local ids
  // Prefix cache: chained hash -> the one block registered under it (in use or free).
  absl::flat_hash_map<BlockHash, BlockId> cached_blocks_;
  absl::flat_hash_map<int64_t, RequestBlocks> requests_;
  bool record_events_ = false;
  std::vector<uint64_t> added_events_;
  std::vector<uint64_t> removed_events_;
  int64_t prefix_queried_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_KV_CACHE_KV_CACHE_MANAGER_H_
