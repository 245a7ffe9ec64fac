// PrefixIndex: the router's approximate view of ONE worker's prefix cache, as a set of block-hash
// short forms (BlockHash::Short(), common/block_hash.h) fed by heartbeat deltas.
//
// Because the hashes are chained, h_i stands for the whole prefix tokens[0, (i+1) * block_size):
// the number of leading hashes of a prompt's chain found here is the number of prompt blocks this
// worker is believed to have cached. It is approximate on purpose: deltas arrive once per
// heartbeat, 64-bit short forms may collide, and memory is capped. When full, the OLDEST inserted
// hash goes first (a FIFO, not an LRU: the router never sees the worker's hits, and the worker's
// own removals arrive as deltas anyway).
//
// Memory: about 40 bytes per hash (flat_hash_map slot + deque entry), so max_blocks = 1M is ~40 MB.
// Thread safety: none; the owner (WorkerRegistry) serializes access.
#ifndef TANDEM_ROUTER_CORE_PREFIX_INDEX_H_
#define TANDEM_ROUTER_CORE_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace tandem::router {

class PrefixIndex {
 public:
  // REQUIRES: max_blocks >= 1.
  explicit PrefixIndex(size_t max_blocks);

  // Inserts hashes (re-inserting one refreshes its age); evicts the oldest beyond max_blocks.
  void Add(absl::Span<const uint64_t> hashes);
  // Removes hashes; unknown ones are ignored.
  void Remove(absl::Span<const uint64_t> hashes);
  void Clear();

  // Number of leading elements of `chain` (h_0, h_1, ...) present in the index.
  size_t MatchPrefix(absl::Span<const uint64_t> chain) const;

  size_t size() const { return seq_by_hash_.size(); }
  size_t max_blocks() const { return max_blocks_; }

 private:
  void Compact();

  size_t max_blocks_;
  uint64_t next_seq_ = 0;
  // hash -> sequence number of its latest insertion.
  absl::flat_hash_map<uint64_t, uint64_t> seq_by_hash_;
  // Insertion order; entries whose seq no longer matches seq_by_hash_ are stale and skipped.
  std::deque<std::pair<uint64_t, uint64_t>> order_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_PREFIX_INDEX_H_
