#include "kvtransfer/rank_reader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/handshake.h"

namespace tandem::kvtransfer {
namespace {

using tandem::v1::RankGeometry;
using tandem::v1::TransferHandshake;

// proto3 zeros read as one rank holding every head.
RankHeads HeadsOf(const RankGeometry& g, int total_heads) {
  if (g.kv_head_count() == 0) return RankHeads{0, total_heads};
  return RankHeads{static_cast<int>(g.kv_head_begin()), static_cast<int>(g.kv_head_count())};
}

}  // namespace

RankKvReader::RankKvReader(TransferAgent* agent, RankKvReaderOptions options)
    : agent_(agent),
      options_(std::move(options)),
      mine_(HeadsOf(options_.geometry, options_.compatibility.layout().num_kv_heads())),
      head_bytes_(int64_t{options_.compatibility.layout().head_dim()} *
                  static_cast<int64_t>(KvElementBytes(options_.compatibility.layout()))) {}

RankKvReader::~RankKvReader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (staging_thread_.joinable()) staging_thread_.join();
  // Nothing may write into the pool or the staging region after we are gone: stop and wait.
  absl::MutexLock lock(&mu_);
  std::vector<TransferId> outstanding;
  for (auto& [id, read] : reads_) {
    for (Part& part : read.parts) {
      if (part.inflight.has_value()) outstanding.push_back(*part.inflight);
    }
  }
  for (Chunk& chunk : chunks_) {
    if (chunk.agent_id.has_value()) outstanding.push_back(*chunk.agent_id);
  }
  for (TransferId id : outstanding) agent_->Cancel(id);
  for (TransferId id : outstanding) {
    while (true) {
      absl::StatusOr<bool> state = agent_->CheckTransfer(id);
      if (!state.ok() || *state) break;
      absl::SleepFor(absl::Microseconds(100));
    }
  }
}

std::string RankKvReader::RankPeerName(const std::string& peer, int rank, int group_size) {
  return group_size <= 1 ? peer : absl::StrCat(peer, "#", rank);
}

BlockShape RankKvReader::LocalShape() const {
  const tandem::v1::KvLayout& l = options_.compatibility.layout();
  return BlockShape{l.num_layers(), l.block_size(), mine_.head_count, head_bytes_};
}

absl::StatusOr<RankKvReader::Source> RankKvReader::PlanSource(
    const std::string& peer, const std::vector<const TransferHandshake*>& ranks) const {
  const tandem::v1::KvLayout& l = options_.compatibility.layout();
  const int total_heads = static_cast<int>(l.num_kv_heads());
  const int n = static_cast<int>(ranks.size());
  Source s;
  for (int r = 0; r < n; ++r) {
    s.agent_peers.push_back(RankPeerName(peer, r, n));
    s.heads.push_back(HeadsOf(ranks[r]->geometry(), total_heads));
    s.shapes.push_back(
        BlockShape{l.num_layers(), l.block_size(), s.heads.back().head_count, head_bytes_});
    // Quantized blocks carry their scales: their size is the one the rank states.
    const uint64_t stated = ranks[r]->geometry().block_bytes();
    s.block_bytes.push_back(stated != 0 ? stated
                                        : static_cast<uint64_t>(s.shapes.back().BlockBytes()));
  }
  absl::StatusOr<std::vector<ReshardPiece>> plan =
      PlanReshard(s.heads, mine_, static_cast<int>(options_.geometry.tp_rank()));
  if (!plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV source ", peer, " (", n, " ranks): ", plan.status().message()));
  }
  s.plan = *std::move(plan);
  s.dp_size = static_cast<int>(std::max<uint32_t>(1, ranks[0]->geometry().dp_size()));
  if (s.dp_size > 1 && s.dp_size != n) {
    return absl::InvalidArgumentError(absl::StrCat("KV source ", peer, " of ", n,
                                                   " ranks states data-parallel size ", s.dp_size));
  }
  return s;
}

absl::Status RankKvReader::AddRankPeersLocked(const std::string& peer, const Source& s,
                                              const std::vector<const TransferHandshake*>& ranks,
                                              const std::vector<bool>& needed) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!needed[r]) continue;
    if (absl::Status added = agent_->AddPeer(s.agent_peers[r], *ranks[r]); !added.ok()) {
      return absl::Status(added.code(),
                          absl::StrCat("KV source ", peer, " rank ", r, ": ", added.message()));
    }
  }
  return absl::OkStatus();
}

// Each piece: direct (whole blocks), strided (the agent re-strides the head slice in its own
// copy), or staged (whole blocks into staging, then scattered here).
bool RankKvReader::ChooseReadFormsLocked(Source& s, const std::vector<bool>& needed) {
  bool staged = false;
  for (const ReshardPiece& piece : s.plan) {
    const bool direct = IsDirect(piece, s.heads[piece.src_rank], mine_);
    bool strided = !direct && head_bytes_ != 0 && options_.strided_reads;
    for (size_t r = 0; r < needed.size(); ++r) {  // every rank a data-parallel source reads from
      if (static_cast<int>(r) == piece.src_rank || (s.dp_size > 1 && needed[r])) {
        strided = strided && agent_->CanReadStrided(s.agent_peers[r], options_.pool_region);
      }
    }
    s.direct.push_back(direct);
    s.strided.push_back(strided);
    staged |= !direct && !strided;
  }
  return staged;
}

absl::Status RankKvReader::ReshardRefused(const std::string& peer, int source_ranks) const {
  return absl::UnimplementedError(absl::StrCat(
      "KV source ", peer, " splits its ",
      static_cast<int>(options_.compatibility.layout().num_kv_heads()), " KV heads over ",
      source_ranks, " ranks, this rank holds heads [", mine_.head_begin, ", ",
      mine_.head_begin + mine_.head_count, "): re-sharding into ",
      head_bytes_ == 0 ? "quantized KV" : "a device pool",
      head_bytes_ == 0 ? "" : " needs strided reads, which this transport cannot do from it",
      " (pair groups of equal tensor-parallel size)"));
}

absl::Status RankKvReader::CheckStagingFitsLocked(const Source& s) {
  RETURN_IF_ERROR(EnsureStagingLocked());
  for (const BlockShape& shape : s.shapes) {
    if (static_cast<uint64_t>(shape.BlockBytes()) > options_.staging_bytes / kSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV staging of ", options_.staging_bytes, " bytes (", kSlots,
                       " slots) holds no block of ", shape.BlockBytes(), " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status RankKvReader::AddSource(const std::string& peer, const TransferHandshake& source) {
  // A group lists every rank; a single rank is its own only entry.
  std::vector<const TransferHandshake*> ranks;
  for (const TransferHandshake& r : source.ranks()) ranks.push_back(&r);
  if (ranks.empty()) ranks.push_back(&source);
  const int n = static_cast<int>(ranks.size());
  ASSIGN_OR_RETURN(Source s, PlanSource(peer, ranks));
  absl::MutexLock lock(&mu_);
  // A data-parallel source serves blocks from every rank (each holds every head).
  std::vector<bool> needed(n, s.dp_size > 1);
  for (const ReshardPiece& piece : s.plan) needed[piece.src_rank] = true;
  RETURN_IF_ERROR(AddRankPeersLocked(peer, s, ranks, needed));
  const bool staged = ChooseReadFormsLocked(s, needed);
  if (staged && (head_bytes_ == 0 || options_.pool == nullptr)) {
    // Refused: leave no half-linked source behind.
    for (int r = 0; r < n; ++r) {
      if (needed[r]) agent_->RemovePeer(s.agent_peers[r]);
    }
    sources_.erase(peer);
    return ReshardRefused(peer, n);
  }
  if (staged) RETURN_IF_ERROR(CheckStagingFitsLocked(s));
  sources_[peer] = std::move(s);
  unreachable_.erase(peer);
  return absl::OkStatus();
}

absl::Status RankKvReader::EnsureStagingLocked() {
  if (staging_ != nullptr) return absl::OkStatus();
  absl::StatusOr<std::pair<void*, uint32_t>> shared =
      agent_->AllocateMemory(options_.staging_bytes, tandem::v1::MEMORY_KIND_HOST);
  if (shared.ok()) {
    staging_ = static_cast<char*>(shared->first);
    staging_region_ = shared->second;
    staging_thread_ = std::thread([this] { StagingLoop(); });
    return absl::OkStatus();
  }
  if (shared.status().code() != absl::StatusCode::kUnimplemented) return shared.status();
  staging_heap_.resize(options_.staging_bytes);
  absl::StatusOr<uint32_t> region = agent_->RegisterMemory(
      staging_heap_.data(), staging_heap_.size(), tandem::v1::MEMORY_KIND_HOST);
  if (!region.ok()) return region.status();
  staging_ = staging_heap_.data();
  staging_region_ = *region;
  staging_thread_ = std::thread([this] { StagingLoop(); });
  return absl::OkStatus();
}

absl::StatusOr<TransferId> RankKvReader::PostRead(
    const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) {
  if (blocks.empty()) return absl::InvalidArgumentError("KV read of no blocks");
  absl::MutexLock lock(&mu_);
  auto source = sources_.find(peer);
  if (source == sources_.end()) {
    return absl::NotFoundError(absl::StrCat("KV source ", peer, " is not linked"));
  }
  for (const auto& [src, dst] : blocks) {
    if (dst < 0 || dst >= options_.pool_blocks || src < 0) {
      return absl::OutOfRangeError(absl::StrCat("KV read of block ", src, " into block ", dst,
                                                " of a pool of ", options_.pool_blocks));
    }
  }
  const Source& s = source->second;
  const TransferId id = next_id_++;
  Read& read = reads_[id];
  read.peer = peer;
  // Per source rank, its share of the blocks (all of them unless the source is data-parallel).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> shares(s.dp_size);
  for (const auto& [src, dst] : blocks) {
    shares[src % s.dp_size].emplace_back(src / s.dp_size, dst);
  }
  for (int r = 0; r < s.dp_size; ++r) {
    if (shares[r].empty()) continue;
    for (size_t i = 0; i < s.plan.size(); ++i) {
      Part part;
      part.piece = s.plan[i];
      if (s.dp_size > 1) part.piece.src_rank = r;
      part.blocks = shares[r];
      part.direct = s.direct[i];
      part.strided = s.strided[i];
      part.agent_peer = s.agent_peers[part.piece.src_rank];
      part.src_shape = s.shapes[part.piece.src_rank];
      part.src_head_begin = s.heads[part.piece.src_rank].head_begin;
      part.src_block_bytes = s.block_bytes[part.piece.src_rank];
      read.parts.push_back(std::move(part));
    }
  }
  for (size_t i = 0; i < read.parts.size(); ++i) {
    Part& part = read.parts[i];
    if (!part.direct && !part.strided) {
      staging_queue_.emplace_back(id, i);
      continue;
    }
    if (absl::Status posted = PostDirectLocked(part); !posted.ok()) {
      FailLocked(read, posted);
      break;
    }
  }
  if (!read.error.ok() && Ended(read)) {
    // Nothing was posted: an error of PostRead, as the agent's would be.
    absl::Status error = read.error;
    reads_.erase(id);
    return error;
  }
  ++stats_.reads;
  FillSlotsLocked();
  return id;
}

absl::Status RankKvReader::PostDirectLocked(Part& part) {
  absl::StatusOr<TransferId> id;
  size_t descriptors = 0;
  if (part.strided) {
    const std::vector<StridedCopyOp> ops = StridedHeadOps(
        part.blocks, part.src_shape, part.piece.head_begin - part.src_head_begin, LocalShape(),
        part.piece.head_begin - mine_.head_begin, part.piece.head_count, options_.pool_region,
        /*remote_region=*/0);
    id = agent_->PostStridedRead(part.agent_peer, ops);
    part.bytes = TotalBytes(ops);
    descriptors = ops.size();
  } else {
    const std::vector<CopyOp> ops = BlockPairsToCopyOps(part.blocks, options_.pool_region,
                                                        /*remote_region=*/0, part.src_block_bytes);
    id = agent_->PostRead(part.agent_peer, ops);
    part.bytes = TotalBytes(ops);
    descriptors = ops.size();
  }
  if (!id.ok()) return id.status();
  part.inflight = *id;
  ++stats_.agent_reads;
  stats_.copy_ops += descriptors;
  return absl::OkStatus();
}

void RankKvReader::FillSlotsLocked() {
  while (!staging_queue_.empty()) {
    int slot = 0;
    while (slot < kSlots && slot_busy_[slot]) ++slot;
    if (slot == kSlots) return;
    auto [id, index] = staging_queue_.front();
    auto it = reads_.find(id);
    if (it == reads_.end()) {
      staging_queue_.pop_front();
      continue;
    }
    Read& read = it->second;
    Part& part = read.parts[index];
    if (!read.error.ok() || part.posted == part.blocks.size()) {
      staging_queue_.pop_front();  // failed, or every chunk of it is out
      continue;
    }
    const size_t fit =
        std::max<uint64_t>(1, options_.staging_bytes / kSlots / part.src_block_bytes);
    Chunk chunk;
    chunk.read = id;
    chunk.part = index;
    chunk.begin = part.posted;
    chunk.end = std::min(part.blocks.size(), part.posted + fit);
    chunk.slot = slot;
    std::vector<uint32_t> local, remote;
    for (size_t i = chunk.begin; i < chunk.end; ++i) {
      local.push_back(static_cast<uint32_t>(i - chunk.begin));
      remote.push_back(static_cast<uint32_t>(part.blocks[i].first));
    }
    const uint64_t slot_offset = static_cast<uint64_t>(slot) * (options_.staging_bytes / kSlots);
    std::vector<CopyOp> ops =
        BlockCopyOps(staging_region_, /*remote_region=*/0, part.src_block_bytes, local, remote);
    for (CopyOp& op : ops) op.local_offset += slot_offset;
    absl::StatusOr<TransferId> agent_id = agent_->PostRead(part.agent_peer, ops);
    if (!agent_id.ok()) {
      FailLocked(read, agent_id.status());
      staging_queue_.pop_front();
      continue;
    }
    chunk.agent_id = *agent_id;
    chunk.bytes = TotalBytes(ops);
    ++stats_.agent_reads;
    stats_.copy_ops += ops.size();
    part.posted = chunk.end;
    slot_busy_[slot] = true;
    ++read.chunks;
    chunks_.push_back(std::move(chunk));
  }
}

void RankKvReader::FailLocked(Read& read, absl::Status status) {
  if (status.code() == absl::StatusCode::kUnavailable) unreachable_.insert(read.peer);
  if (!read.error.ok()) return;
  read.error = std::move(status);
  for (Part& part : read.parts) {
    if (part.inflight.has_value()) agent_->Cancel(*part.inflight);
  }
  for (Chunk& chunk : chunks_) {
    if (&reads_[chunk.read] == &read && chunk.agent_id.has_value()) agent_->Cancel(*chunk.agent_id);
  }
}

bool RankKvReader::Ended(const Read& read) {
  if (read.chunks > 0) return false;
  for (const Part& part : read.parts) {
    if (part.inflight.has_value()) return false;
    if (read.error.ok() && !part.finished) return false;
  }
  return true;
}

absl::Status RankKvReader::ScatterChunk(const Part& part, const Chunk& chunk) {
  const BlockShape local_shape = LocalShape();
  const char* staged =
      staging_ + static_cast<uint64_t>(chunk.slot) * (options_.staging_bytes / kSlots);
  std::vector<int32_t> local_blocks;
  for (size_t i = chunk.begin; i < chunk.end; ++i) local_blocks.push_back(part.blocks[i].second);
  const int64_t count = static_cast<int64_t>(local_blocks.size());
  const int local_head = part.piece.head_begin - mine_.head_begin;
  if (part.piece.head_begin == part.src_head_begin &&
      part.piece.head_count == part.src_shape.num_kv_heads) {
    // Whole source blocks are already the staging layout of all their heads.
    return ScatterHeads(staged, count * part.src_shape.BlockBytes(), options_.pool, local_shape,
                        options_.pool_blocks, local_blocks, local_head, part.piece.head_count);
  }
  // The source rank holds more heads than this piece: pick them out first.
  std::vector<int32_t> in_slot(local_blocks.size());
  std::iota(in_slot.begin(), in_slot.end(), 0);
  std::vector<char> heads(
      static_cast<size_t>(StagingBytes(part.src_shape, count, part.piece.head_count)));
  RETURN_IF_ERROR(GatherHeads(staged, part.src_shape, count, in_slot,
                              part.piece.head_begin - part.src_head_begin, part.piece.head_count,
                              heads.data(), static_cast<int64_t>(heads.size())));
  return ScatterHeads(heads.data(), static_cast<int64_t>(heads.size()), options_.pool, local_shape,
                      options_.pool_blocks, local_blocks, local_head, part.piece.head_count);
}

void RankKvReader::StagingLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    bool progressed = false;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      Chunk& chunk = chunks_[c];
      if (chunk.scattering || !chunk.agent_id.has_value()) continue;
      absl::StatusOr<bool> state = agent_->CheckTransfer(*chunk.agent_id);
      if (state.ok() && !*state) continue;
      chunk.agent_id.reset();
      progressed = true;
      Read& read = reads_[chunk.read];
      Part& part = read.parts[chunk.part];
      absl::Status status = state.status();
      if (status.ok() && read.error.ok()) {
        stats_.bytes_read += chunk.bytes;
        // Scatter without the lock: the chunk's slot and blocks are its own until it is
        // released below, and its read cannot end while it counts in read.chunks.
        chunk.scattering = true;
        const Chunk copy = chunk;
        mu_.Unlock();
        status = ScatterChunk(part, copy);
        mu_.Lock();
        if (status.ok()) {
          part.done += copy.end - copy.begin;
          part.finished = part.done == part.blocks.size();
          stats_.bytes_kept += static_cast<uint64_t>(StagingBytes(
              part.src_shape, static_cast<int64_t>(copy.end - copy.begin), part.piece.head_count));
        }
      }
      if (!status.ok()) FailLocked(read, status);
      // Release the chunk (find it again: the vector may have grown while unlocked).
      for (size_t i = 0; i < chunks_.size(); ++i) {
        if (chunks_[i].read == chunk.read && chunks_[i].part == chunk.part &&
            chunks_[i].begin == chunk.begin) {
          slot_busy_[chunks_[i].slot] = false;
          chunks_.erase(chunks_.begin() + i);
          break;
        }
      }
      --read.chunks;
      break;  // chunks_ changed: start over
    }
    FillSlotsLocked();
    if (!progressed) {
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake),
                           chunks_.empty() ? absl::Milliseconds(20) : absl::Microseconds(50));
    }
  }
}

void RankKvReader::ProgressDirectLocked() {
  for (auto& [id, read] : reads_) {
    for (Part& part : read.parts) {
      if (!part.inflight.has_value()) continue;
      absl::StatusOr<bool> state = agent_->CheckTransfer(*part.inflight);
      if (state.ok() && !*state) continue;
      part.inflight.reset();
      if (!state.ok()) {
        FailLocked(read, state.status());
        continue;
      }
      if (!read.error.ok()) continue;
      part.finished = true;
      stats_.bytes_read += part.bytes;
      stats_.bytes_kept += part.bytes;
    }
  }
}

absl::StatusOr<bool> RankKvReader::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = reads_.find(id);
  if (it == reads_.end()) return absl::NotFoundError(absl::StrCat("no KV read ", id));
  ProgressDirectLocked();
  FillSlotsLocked();
  if (!Ended(it->second)) return false;
  absl::Status error = it->second.error;
  reads_.erase(it);
  if (!error.ok()) return error;
  return true;
}

void RankKvReader::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = reads_.find(id);
  if (it == reads_.end()) return;
  FailLocked(it->second, absl::CancelledError("KV read cancelled"));
}

absl::Status RankKvReader::SyncForRemoteRead(absl::Span<const int32_t> block_ids) {
  const uint64_t block_bytes = options_.geometry.block_bytes() != 0
                                   ? options_.geometry.block_bytes()
                                   : static_cast<uint64_t>(LocalShape().BlockBytes());
  if (block_ids.empty() || block_bytes == 0) return absl::OkStatus();
  return agent_->SyncForRemoteRead(options_.pool_region,
                                   BlocksToByteRanges(block_ids, block_bytes));
}

bool RankKvReader::SourceLinked(const std::string& peer) const {
  absl::MutexLock lock(&mu_);
  return sources_.contains(peer) && !unreachable_.contains(peer);
}

RankKvReaderStats RankKvReader::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tandem::kvtransfer
