// FreeBlockQueue: the KV cache's free blocks (ref count 0) in eviction order.
//
// Why an intrusive doubly linked list over block ids, not std::deque or std::list:
//  * A free block may still hold a cached prefix (it has a hash). When a new request hits that
//    prefix, the block is "revived": it must leave the queue from wherever it sits, in O(1).
//    A deque cannot remove from the middle cheaply; std::list could, but needs a node allocation
//    per push and an iterator stored per block.
//  * The links live in two arrays indexed by block id (prev_[id], next_[id]), allocated once at
//    construction; push, pop and remove never allocate. Index num_blocks is a sentinel that
//    closes the list into a ring (sentinel.next = head, sentinel.prev = tail), so no operation
//    special-cases an empty list or the ends. A block outside the queue has both links set to
//    kNotQueued, which also makes membership an O(1) test.
//
// Order: the head is evicted (reused) next, the tail last. Initially all blocks are queued in id
// order. The KV cache manager appends freed blocks at the tail, so the head is the least recently
// freed block; it appends a request's blocks in reverse block-table order, so within one chain
// the last block is evicted first (a prefix stays useful while its tail goes).
//
// Thread safety: none; owned by the KvCacheManager, which is single-threaded.
#ifndef TANDEM_RUNTIME_KV_CACHE_FREE_BLOCK_QUEUE_H_
#define TANDEM_RUNTIME_KV_CACHE_FREE_BLOCK_QUEUE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tandem::runtime {

// Physical block index in the worker's KV pool, in [0, num_blocks).
using BlockId = int32_t;

class FreeBlockQueue {
 public:
  // REQUIRES: 0 <= num_blocks < INT32_MAX (the sentinel takes one more index).
  explicit FreeBlockQueue(BlockId num_blocks);

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool Contains(BlockId id) const { return next_[id] != kNotQueued; }

  // REQUIRES: !empty().
  BlockId Front() const { return next_[sentinel_]; }
  BlockId PopFront();

  // REQUIRES: Contains(id). O(1) from anywhere in the queue.
  void Remove(BlockId id);
  // REQUIRES: 0 <= id < num_blocks and !Contains(id).
  void PushBack(BlockId id);

  // Queued ids from head (next to evict) to tail. O(size); for tests and invariant checks.
  std::vector<BlockId> ToVector() const;
  // Links consistent in both directions, no cycle short of the sentinel, size() matches;
  // INTERNAL with the first problem found otherwise. O(num_blocks).
  absl::Status CheckInvariants() const;

 private:
  static constexpr BlockId kNotQueued = -1;

  // prev_/next_: [num_blocks + 1], the last entry being the sentinel.
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  BlockId sentinel_;
  int64_t size_ = 0;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_KV_CACHE_FREE_BLOCK_QUEUE_H_
