#include "router/core/prefix_index.h"

#include <algorithm>

namespace tandem::router {

PrefixIndex::PrefixIndex(size_t max_blocks) : max_blocks_(std::max<size_t>(max_blocks, 1)) {}

void PrefixIndex::Add(absl::Span<const uint64_t> hashes) {
  for (uint64_t h : hashes) {
    const uint64_t seq = next_seq_++;
    seq_by_hash_[h] = seq;
    order_.emplace_back(h, seq);
  }
  while (seq_by_hash_.size() > max_blocks_) {
    auto [hash, seq] = order_.front();
    order_.pop_front();
    auto it = seq_by_hash_.find(hash);
    if (it != seq_by_hash_.end() && it->second == seq) seq_by_hash_.erase(it);
  }
  Compact();
}

void PrefixIndex::Remove(absl::Span<const uint64_t> hashes) {
  for (uint64_t h : hashes) seq_by_hash_.erase(h);
  Compact();
}

void PrefixIndex::Clear() {
  seq_by_hash_.clear();
  order_.clear();
}

size_t PrefixIndex::MatchPrefix(absl::Span<const uint64_t> chain) const {
  size_t n = 0;
  while (n < chain.size() && seq_by_hash_.contains(chain[n])) ++n;
  return n;
}

// Removals and re-insertions leave stale deque entries; rebuild once they outnumber the live ones
// so the deque stays O(size) (amortized O(1) per operation).
void PrefixIndex::Compact() {
  if (order_.size() <= 2 * seq_by_hash_.size() + 64) return;
  std::deque<std::pair<uint64_t, uint64_t>> live;
  for (const auto& [hash, seq] : order_) {
    auto it = seq_by_hash_.find(hash);
    if (it != seq_by_hash_.end() && it->second == seq) live.emplace_back(hash, seq);
  }
  order_ = std::move(live);
}

}  // namespace tandem::router
