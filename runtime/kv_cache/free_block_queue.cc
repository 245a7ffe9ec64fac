#include "runtime/kv_cache/free_block_queue.h"

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

FreeBlockQueue::FreeBlockQueue(BlockId num_blocks)
    : prev_(num_blocks + 1), next_(num_blocks + 1), sentinel_(num_blocks), size_(num_blocks) {
  // Ring sentinel <-> 0 <-> 1 <-> ... <-> num_blocks - 1 <-> sentinel (next of the last block is
  // num_blocks, the sentinel, by construction).
  for (BlockId id = 0; id < num_blocks; ++id) {
    prev_[id] = id == 0 ? sentinel_ : id - 1;
    next_[id] = id + 1;
  }
  next_[sentinel_] = num_blocks > 0 ? 0 : sentinel_;
  prev_[sentinel_] = num_blocks > 0 ? num_blocks - 1 : sentinel_;
}

BlockId FreeBlockQueue::PopFront() {
  const BlockId id = next_[sentinel_];
  Remove(id);
  return id;
}

void FreeBlockQueue::Remove(BlockId id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  prev_[id] = next_[id] = kNotQueued;
  --size_;
}

void FreeBlockQueue::PushBack(BlockId id) {
  const BlockId tail = prev_[sentinel_];
  next_[tail] = id;
  prev_[id] = tail;
  next_[id] = sentinel_;
  prev_[sentinel_] = id;
  ++size_;
}

std::vector<BlockId> FreeBlockQueue::ToVector() const {
  std::vector<BlockId> ids;
  ids.reserve(size_);
  for (BlockId id = next_[sentinel_]; id != sentinel_ && ids.size() <= prev_.size();
       id = next_[id]) {
    ids.push_back(id);
  }
  return ids;
}

absl::Status FreeBlockQueue::CheckInvariants() const {
  int64_t count = 0;
  BlockId prev = sentinel_;
  // A sound ring returns to the sentinel within num_blocks + 1 steps.
  for (BlockId id = next_[sentinel_]; id != sentinel_; id = next_[id]) {
    if (id < 0 || id >= sentinel_) {
      return absl::InternalError(absl::StrCat("free queue: link to invalid block ", id));
    }
    if (prev_[id] != prev) {
      return absl::InternalError(
          absl::StrCat("free queue: block ", id, " has prev ", prev_[id], " but follows ", prev));
    }
    if (++count > sentinel_) return absl::InternalError("free queue: cycle without the sentinel");
    prev = id;
  }
  if (prev_[sentinel_] != prev) {
    return absl::InternalError(
        absl::StrCat("free queue: tail is ", prev_[sentinel_], " but the walk ends at ", prev));
  }
  if (count != size_) {
    return absl::InternalError(
        absl::StrCat("free queue: size() is ", size_, " but ", count, " blocks are linked"));
  }
  int64_t marked = 0;
  for (BlockId id = 0; id < sentinel_; ++id) {
    const bool unlinked = next_[id] == kNotQueued && prev_[id] == kNotQueued;
    const bool linked = next_[id] != kNotQueued && prev_[id] != kNotQueued;
    if (!unlinked && !linked) {
      return absl::InternalError(absl::StrCat("free queue: block ", id, " is half linked"));
    }
    if (linked) ++marked;
  }
  if (marked != size_) {
    return absl::InternalError(
        absl::StrCat("free queue: ", marked, " blocks marked queued, ", size_, " linked"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
