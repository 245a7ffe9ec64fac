#include "runtime/kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem::runtime {
namespace {

DcpBlockLayout DcpLayoutOf(const KvCacheConfig& config) {
  return DcpBlockLayout::FromFlags(config.dcp_size, config.dcp_interleave, config.block_size);
}

}  // namespace

absl::StatusOr<int64_t> NumBlocksForBudget(int64_t budget_bytes, int64_t block_bytes) {
  if (block_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache block size in bytes must be positive, got ", block_bytes));
  }
  if (budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache budget must not be negative, got ", budget_bytes, " bytes"));
  }
  const int64_t num_blocks = budget_bytes / block_bytes;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget of ", budget_bytes,
                                                   " bytes holds no block of ", block_bytes,
                                                   " bytes; raise the budget or shrink blocks"));
  }
  return num_blocks;
}

double KvCacheStats::Usage() const {
  return num_blocks > 0 ? 1.0 - static_cast<double>(num_free_blocks) / num_blocks : 0.0;
}

double KvCacheStats::HitRate() const {
  return prefix_queried_tokens > 0 ? static_cast<double>(prefix_hit_tokens) / prefix_queried_tokens
                                   : 0.0;
}

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheConfig& config) {
  // The free queue needs one extra index (its sentinel) in BlockId's range.
  if (config.num_blocks < 1 || config.num_blocks >= std::numeric_limits<BlockId>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheConfig.num_blocks must be in [1, ",
                                                   std::numeric_limits<BlockId>::max(), "), got ",
                                                   config.num_blocks));
  }
  if (config.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheConfig.block_size must be >= 1, got ", config.block_size));
  }
  const DcpBlockLayout dcp = DcpLayoutOf(config);
  if (absl::Status status = dcp.Validate(); !status.ok()) return status;
  if (config.num_blocks % dcp.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheConfig.num_blocks ", config.num_blocks,
                                                   " is not a multiple of dcp_size ", dcp.size));
  }
  if (config.dp_size < 1 || (config.dp_size > 1 && dcp.size > 1) ||
      config.num_blocks % config.dp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheConfig.dp_size ", config.dp_size, " must be >= 1, divide num_blocks ",
                     config.num_blocks, " and not be combined with dcp_size ", dcp.size));
  }
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(config));
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : block_size_(config.block_size),
      dcp_(DcpLayoutOf(config)),
      dp_size_(config.dp_size),
      num_pools_(dcp_.size * config.dp_size),
      enable_prefix_caching_(config.enable_prefix_caching && dcp_.WholeBlocks()),
      blocks_(config.num_blocks) {
  free_queues_.reserve(num_pools_);
  for (int64_t k = 0; k < num_pools_; ++k) {
    free_queues_.emplace_back(static_cast<BlockId>(config.num_blocks / num_pools_));
  }
}

int64_t KvCacheManager::NumFreeBlocks() const {
  int64_t total = 0;
  for (const FreeBlockQueue& queue : free_queues_) total += queue.size();
  return total;
}

bool KvCacheManager::IsFree(BlockId id) const {
  return free_queues_[id % num_pools_].Contains(static_cast<BlockId>(id / num_pools_));
}

void KvCacheManager::PushFree(BlockId id) {
  free_queues_[id % num_pools_].PushBack(static_cast<BlockId>(id / num_pools_));
}

void KvCacheManager::RemoveFree(BlockId id) {
  free_queues_[id % num_pools_].Remove(static_cast<BlockId>(id / num_pools_));
}

bool KvCacheManager::ShardsHaveRoom(int64_t owned, int64_t wanted, const PrefixMatch* prefix,
                                    int64_t dp_rank) const {
  if (dp_size_ > 1) {  // every block of the request from its DP rank's pool
    int64_t need = std::max<int64_t>(0, wanted - owned);
    if (prefix != nullptr) {
      for (const BlockId id : prefix->blocks) need += blocks_[id].ref_count == 0;
    }
    return need <= free_queues_[dp_rank].size();
  }
  if (dcp_.size == 1) {
    int64_t free_in_prefix = 0;
    if (prefix != nullptr) {
      for (const BlockId id : prefix->blocks) free_in_prefix += blocks_[id].ref_count == 0;
    }
    return std::max<int64_t>(0, wanted - owned) + free_in_prefix <= NumFreeBlocks();
  }
  std::vector<int64_t> need(dcp_.size, 0);
  for (int64_t i = owned; i < wanted; ++i) ++need[dcp_.ShardOfBlock(i)];
  if (prefix != nullptr) {
    for (const BlockId id : prefix->blocks) need[dcp_.ShardOfId(id)] += blocks_[id].ref_count == 0;
  }
  for (int64_t k = 0; k < dcp_.size; ++k) {
    if (need[k] > free_queues_[k].size()) return false;
  }
  return true;
}

PrefixMatch KvCacheManager::FindCachedPrefix(absl::Span<const int32_t> tokens,
                                             absl::string_view salt, bool record_stats,
                                             int64_t dp_rank) {
  PrefixMatch match;
  if (!enable_prefix_caching_) return match;
  // Leave at least one token to compute: the last prompt token's logits come from running it.
  const int64_t max_blocks =
      tokens.empty() ? 0 : static_cast<int64_t>(tokens.size() - 1) / block_size_;
  BlockHash prev;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash hash =
        HashNextBlock(i == 0 ? nullptr : &prev, tokens.subspan(i * block_size_, block_size_), salt);
    const auto it = cached_blocks_.find(hash);
    if (it == cached_blocks_.end()) break;  // the chain breaks here: no later block can match
    if (it->second % num_pools_ != dp_rank && dp_size_ > 1) break;  // another DP rank's KV
    match.blocks.push_back(it->second);
    prev = hash;
  }
  match.num_tokens = static_cast<int64_t>(match.blocks.size()) * block_size_;
  if (record_stats) {
    prefix_queried_tokens_ += static_cast<int64_t>(tokens.size());
    prefix_hit_tokens_ += match.num_tokens;
  }
  return match;
}

bool KvCacheManager::ValidPrefix(const PrefixMatch& prefix, int64_t* num_free) const {
  *num_free = 0;
  for (const BlockId id : prefix.blocks) {
    if (id < 0 || id >= num_blocks() || !blocks_[id].cached) return false;
    if (blocks_[id].ref_count == 0) ++*num_free;
  }
  return true;
}

int64_t KvCacheManager::NumBlocksNeeded(int64_t request_id, int64_t num_tokens,
                                        const PrefixMatch* prefix) const {
  const int64_t blocks_wanted = dcp_.NumBlocks(num_tokens);
  const auto it = requests_.find(request_id);
  if (it != requests_.end() && !it->second.block_table.empty()) {
    return std::max<int64_t>(0, blocks_wanted - it->second.block_table.size());
  }
  int64_t num_prefix = 0;
  int64_t num_free_in_prefix = 0;
  if (prefix != nullptr && ValidPrefix(*prefix, &num_free_in_prefix)) {
    num_prefix = static_cast<int64_t>(prefix->blocks.size());
  }
  return std::max<int64_t>(0, blocks_wanted - num_prefix) + num_free_in_prefix;
}

BlockId KvCacheManager::TakeFreeBlock(int64_t pool) {
  const auto id = static_cast<BlockId>(free_queues_[pool].PopFront() * num_pools_ + pool);
  Block& block = blocks_[id];
  if (block.cached) {  // evict: the new owner overwrites the KV this hash described
    cached_blocks_.erase(block.hash);
    if (record_events_) removed_events_.push_back(block.hash.Short());
    block.cached = false;
    block.hash = BlockHash{};
  }
  block.ref_count = 1;
  return id;
}

bool KvCacheManager::Allocate(int64_t request_id, int64_t num_tokens, const PrefixMatch* prefix,
                              int64_t dp_rank) {
  if (dp_rank < 0 || dp_rank >= dp_size_) return false;
  const int64_t blocks_wanted = dcp_.NumBlocks(num_tokens);
  auto it = requests_.find(request_id);
  const bool first = it == requests_.end() || it->second.block_table.empty();
  const bool use_prefix = first && prefix != nullptr && !prefix->blocks.empty();

  // Ask first, entirely without side effects, so failure changes nothing.
  int64_t num_prefix = 0;
  int64_t num_free_in_prefix = 0;
  if (use_prefix) {
    if (!ValidPrefix(*prefix, &num_free_in_prefix)) return false;
    for (const BlockId id : prefix->blocks) {
      if (dp_size_ > 1 && id % num_pools_ != dp_rank) return false;  // another DP rank's block
    }
    num_prefix = static_cast<int64_t>(prefix->blocks.size());
  }
  const int64_t num_owned = first ? num_prefix : it->second.block_table.size();
  const int64_t num_new = std::max<int64_t>(0, blocks_wanted - num_owned);
  if (!ShardsHaveRoom(num_owned, blocks_wanted, use_prefix ? prefix : nullptr, dp_rank)) {
    return false;
  }
  if (num_new == 0 && num_prefix == 0) return true;

  // Act. Prefix blocks first, so taking new blocks from the queue cannot evict them.
  if (it == requests_.end()) it = requests_.try_emplace(request_id).first;
  RequestBlocks& request = it->second;
  request.block_table.reserve(num_owned + num_new);
  if (use_prefix) {
    request.block_hashes.clear();
    for (const BlockId id : prefix->blocks) {
      Block& block = blocks_[id];
      if (block.ref_count == 0) RemoveFree(id);  // revive a free cached block
      ++block.ref_count;
      request.block_table.push_back(id);
      // The prefix blocks' hashes are this request's chain: CacheBlocks continues from them.
      request.block_hashes.push_back(block.hash);
    }
  }
  for (int64_t i = num_owned; i < num_owned + num_new; ++i) {
    request.block_table.push_back(TakeFreeBlock(dp_size_ > 1 ? dp_rank : dcp_.ShardOfBlock(i)));
  }
  return true;
}

void KvCacheManager::CacheBlocks(int64_t request_id, absl::Span<const int32_t> tokens,
                                 absl::string_view salt, int64_t num_tokens) {
  if (!enable_prefix_caching_) return;
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestBlocks& request = it->second;
  const int64_t usable_tokens = std::min<int64_t>(num_tokens, tokens.size());
  const int64_t num_full = std::min<int64_t>(std::max<int64_t>(usable_tokens, 0) / block_size_,
                                             request.block_table.size());
  for (int64_t i = request.block_hashes.size(); i < num_full; ++i) {
    const BlockHash hash = HashNextBlock(i == 0 ? nullptr : &request.block_hashes[i - 1],
                                         tokens.subspan(i * block_size_, block_size_), salt);
    request.block_hashes.push_back(hash);
    const BlockId id = request.block_table[i];
    Block& block = blocks_[id];
    if (block.cached) continue;  // already registered (a shared prefix block)
    // try_emplace keeps an existing mapping: the first registered copy stays the cached one, so
    // block tables of other requests and the router's view never see a hash move.
    if (cached_blocks_.try_emplace(hash, id).second) {
      block.cached = true;
      block.hash = hash;
      if (record_events_) added_events_.push_back(hash.Short());
    }
  }
}

void KvCacheManager::Free(int64_t request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const std::vector<BlockId>& table = it->second.block_table;
  // Reverse order: the chain's last block lands nearest the head and is evicted first; its
  // first block, the most shareable, survives longest.
  for (auto id = table.rbegin(); id != table.rend(); ++id) {
    if (--blocks_[*id].ref_count == 0) PushFree(*id);
  }
  requests_.erase(it);
}

std::vector<uint64_t> KvCacheManager::CachedHashesShort() const {
  std::vector<uint64_t> out;
  out.reserve(cached_blocks_.size());
  for (const auto& [hash, id] : cached_blocks_) out.push_back(hash.Short());
  return out;
}

void KvCacheManager::EnableCacheEvents(bool enable) {
  record_events_ = enable;
  if (!enable) {
    added_events_.clear();
    removed_events_.clear();
  }
}

void KvCacheManager::TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
  added->swap(added_events_);
  removed->swap(removed_events_);
  added_events_.clear();
  removed_events_.clear();
}

absl::Span<const BlockId> KvCacheManager::BlockTable(int64_t request_id) const {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.block_table;
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats stats;
  stats.num_blocks = num_blocks();
  stats.num_free_blocks = NumFreeBlocks();
  stats.num_cached_blocks = static_cast<int64_t>(cached_blocks_.size());
  stats.prefix_queried_tokens = prefix_queried_tokens_;
  stats.prefix_hit_tokens = prefix_hit_tokens_;
  for (const FreeBlockQueue& queue : free_queues_)
    stats.free_blocks_per_shard.push_back(queue.size());
  return stats;
}

absl::Status KvCacheManager::CheckInvariants() const {
  for (const FreeBlockQueue& queue : free_queues_) {
    if (absl::Status status = queue.CheckInvariants(); !status.ok()) return status;
  }

  std::vector<int32_t> references(blocks_.size(), 0);
  for (const auto& [request_id, request] : requests_) {
    absl::flat_hash_set<BlockId> seen;
    if (request.block_hashes.size() > request.block_table.size()) {
      return absl::InternalError(absl::StrCat("request ", request_id, " has ",
                                              request.block_hashes.size(), " hashes for ",
                                              request.block_table.size(), " blocks"));
    }
    for (size_t i = 0; i < request.block_table.size(); ++i) {
      const BlockId id = request.block_table[i];
      if (id < 0 || id >= num_blocks()) {
        return absl::InternalError(
            absl::StrCat("request ", request_id, " holds invalid block ", id));
      }
      if (!seen.insert(id).second) {
        return absl::InternalError(
            absl::StrCat("request ", request_id, " holds block ", id, " twice"));
      }
      ++references[id];
      // DCP: logical block i on its shard; DP attention: every block on the first one's rank.
      const int64_t pool = dp_size_ > 1 ? request.block_table[0] % num_pools_
                                        : dcp_.ShardOfBlock(static_cast<int64_t>(i));
      if (id % num_pools_ != pool) {
        return absl::InternalError(absl::StrCat("request ", request_id, " block ", i, " (physical ",
                                                id, ") is in pool ", id % num_pools_, ", not ",
                                                pool));
      }
      if (i < request.block_hashes.size() && blocks_[id].cached &&
          blocks_[id].hash != request.block_hashes[i]) {
        return absl::InternalError(absl::StrCat("request ", request_id, " block ", i, " (physical ",
                                                id, ") is cached under ", blocks_[id].hash.ToHex(),
                                                " but the request's chain says ",
                                                request.block_hashes[i].ToHex()));
      }
    }
  }

  int64_t num_cached = 0;
  for (BlockId id = 0; id < num_blocks(); ++id) {
    const Block& block = blocks_[id];
    if (block.ref_count != references[id]) {
      return absl::InternalError(absl::StrCat("block ", id, " has ref_count ", block.ref_count,
                                              " but ", references[id], " block tables hold it"));
    }
    if ((block.ref_count == 0) != IsFree(id)) {
      return absl::InternalError(absl::StrCat("block ", id, " has ref_count ", block.ref_count,
                                              " but is ", IsFree(id) ? "" : "not ",
                                              "in the free queue"));
    }
    if (block.cached) {
      ++num_cached;
      const auto it = cached_blocks_.find(block.hash);
      if (it == cached_blocks_.end() || it->second != id) {
        return absl::InternalError(absl::StrCat("block ", id, " is marked cached under ",
                                                block.hash.ToHex(), " but the map disagrees"));
      }
    }
  }
  if (num_cached != static_cast<int64_t>(cached_blocks_.size())) {
    return absl::InternalError(absl::StrCat(cached_blocks_.size(), " hashes map to blocks but ",
                                            num_cached, " blocks are marked cached"));
  }
  if (!enable_prefix_caching_ && num_cached != 0) {
    return absl::InternalError("blocks are cached although prefix caching is disabled");
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
