#include "runtime/parallel/group_kv.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kvtransfer/handshake.h"
#include "runtime/kv_cache/dcp_blocks.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

tandem::v1::KvDtype ToProto(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return tandem::v1::KV_DTYPE_F32;
    case KvDtype::kF16:
      return tandem::v1::KV_DTYPE_F16;
    case KvDtype::kBf16:
      return tandem::v1::KV_DTYPE_BF16;
    case KvDtype::kFp8E4m3:
      return tandem::v1::KV_DTYPE_FP8_E4M3;
  }
  return tandem::v1::KV_DTYPE_UNSPECIFIED;
}

void SetError(tandem::v1::KvReply* reply, const absl::Status& s) {
  if (s.ok() || reply->code() != 0) return;
  reply->set_code(static_cast<int>(s.code()));
  reply->set_message(std::string(s.message()));
}

absl::Status ReplyStatus(const tandem::v1::KvReply& reply, int rank) {
  if (reply.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                      absl::StrCat("rank ", rank, ": ", reply.message()));
}

}  // namespace

tandem::v1::CompatibilityInfo KvLayoutInfo(const ModelConfig& model, int64_t block_size,
                                           KvDtype kv_dtype) {
  kvtransfer::KvCompatibilityFacts facts;
  facts.model_dtype = KvDtypeName(kv_dtype);
  facts.num_layers = static_cast<uint32_t>(model.num_hidden_layers);
  facts.num_kv_heads = static_cast<uint32_t>(model.num_key_value_heads);
  facts.head_dim = static_cast<uint32_t>(model.head_dim);
  facts.block_size = static_cast<uint32_t>(block_size);
  facts.kv_dtype = ToProto(kv_dtype);
  // FP8 latent KV (kv_layout.h): one scale per token and layer, inside the worker's pool; GQA FP8
  // KV: one scale per tensor (a layer's K or V), outside the blocks: kFp8KvTensorScale, stated
  // here, or a calibrated checkpoint's own, which its model_id pins (the same files on both
  // sides).
  if (kv_dtype == KvDtype::kFp8E4m3 && model.IsMla()) {
    facts.scale_granularity = tandem::v1::KV_SCALE_PER_TOKEN_HEAD;
  } else if (kv_dtype == KvDtype::kFp8E4m3) {
    facts.scale_granularity = tandem::v1::KV_SCALE_PER_TENSOR;
    if (!model.quantization.kv_cache_fp8) {
      facts.k_scales = {kFp8KvTensorScale};
      facts.v_scales = {kFp8KvTensorScale};
    }
  }
  if (model.IsMla()) {  // the latent layout (KvLayoutForModel): one row per token and layer
    const kernels::KvCacheLayout latent = KvLayoutForModel(model, 1, block_size);
    facts.num_kv_heads = static_cast<uint32_t>(latent.num_kv_heads);
    facts.head_dim = static_cast<uint32_t>(latent.head_dim);
    facts.kv_lora_rank = static_cast<uint32_t>(model.kv_lora_rank);
    facts.qk_rope_head_dim = static_cast<uint32_t>(model.qk_rope_head_dim);
  }
  return kvtransfer::CompatibilityFor(facts);
}

RankKvEndpoint::RankKvEndpoint(kvtransfer::TransferAgent* agent, RankKvEndpointOptions options)
    : agent_(agent), options_(std::move(options)) {}

absl::StatusOr<void*> RankKvEndpoint::AllocatePool(int64_t bytes) {
  absl::StatusOr<std::pair<void*, uint32_t>> shared =
      agent_->AllocateMemory(static_cast<uint64_t>(bytes), tandem::v1::MEMORY_KIND_HOST);
  if (shared.status().code() == absl::StatusCode::kUnimplemented) return nullptr;
  if (!shared.ok()) return shared.status();
  absl::MutexLock lock(&mu_);
  allocated_region_ = shared->second;
  return shared->first;
}

absl::Status RankKvEndpoint::PoolReady(ModelExecutor& executor, const ExecutorSpec& spec) {
  std::optional<uint32_t> region;
  {
    absl::MutexLock lock(&mu_);
    region = allocated_region_;
  }
  if (!region.has_value()) {
    ASSIGN_OR_RETURN(
        region, agent_->RegisterMemory(executor.kv_pool_data(),
                                       static_cast<uint64_t>(executor.kv_pool_bytes()),
                                       executor.pool_on_device() ? tandem::v1::MEMORY_KIND_CUDA
                                                                 : tandem::v1::MEMORY_KIND_HOST));
  }
  char* host = executor.pool_on_device() ? nullptr : static_cast<char*>(executor.kv_pool_data());
  return AttachPool(*region, host, spec.num_blocks, spec.block_size, executor.kv_pool_bytes());
}

absl::Status RankKvEndpoint::AttachPool(uint32_t region, char* pool, int64_t num_blocks,
                                        int64_t block_size, int64_t pool_bytes) {
  ASSIGN_OR_RETURN(const TpDims dims,
                   ComputeTpDims(options_.model,
                                 TpShard{options_.tp_rank, options_.tp_size, options_.dcp_size}));
  // A DeepSeek MLA latent is whole on every rank (KvLayoutForModel): its one "head" is not split;
  // a data-parallel attention rank holds every head of its own requests.
  const bool latent = options_.model.IsMla();
  const bool whole = options_.dp_size > 1;
  const int64_t kv_begin = latent || whole ? 0 : dims.kv_head_begin;
  const int64_t kv_count = latent ? 1 : whole ? options_.model.num_key_value_heads : dims.kv_heads;
  tandem::v1::RankGeometry g;
  g.set_tp_size(static_cast<uint32_t>(options_.tp_size));
  g.set_tp_rank(static_cast<uint32_t>(options_.tp_rank));
  g.set_kv_head_begin(static_cast<uint32_t>(kv_begin));
  g.set_kv_head_count(static_cast<uint32_t>(kv_count));
  g.set_dcp_size(static_cast<uint32_t>(options_.dcp_size));
  if (whole) g.set_dp_size(static_cast<uint32_t>(options_.dp_size));
  const DcpBlockLayout dcp =
      DcpBlockLayout::FromFlags(options_.dcp_size, options_.dcp_interleave, block_size);
  g.set_dcp_interleave(static_cast<uint32_t>(dcp.size == 1 ? 1 : dcp.interleave));
  g.set_block_bytes(static_cast<uint64_t>(KvBlockBytes(
      options_.model, block_size, options_.kv_dtype, KvHeadShare{kv_begin, kv_count})));
  if (num_blocks <= 0 || static_cast<uint64_t>(pool_bytes) < num_blocks * g.block_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool of ", pool_bytes, " bytes cannot hold ",
                                                   num_blocks, " blocks of ", g.block_bytes()));
  }
  kvtransfer::RankKvReaderOptions reader;
  reader.compatibility = KvLayoutInfo(options_.model, block_size, options_.kv_dtype);
  reader.geometry = g;
  reader.pool_region = region;
  reader.pool = pool;
  reader.pool_blocks = num_blocks;
  reader.staging_bytes = options_.staging_bytes;
  absl::MutexLock lock(&mu_);
  geometry_ = g;
  layout_ = reader.compatibility;
  reader_ = std::make_unique<kvtransfer::RankKvReader>(agent_, std::move(reader));
  return absl::OkStatus();
}

std::vector<std::pair<int32_t, int32_t>> RankKvEndpoint::ShardBlocks(
    const tandem::v1::KvRead& read) const {
  std::vector<std::pair<int32_t, int32_t>> blocks;
  const int n = std::min(read.source_blocks_size(), read.local_blocks_size());
  if (options_.dp_size > 1) {  // data-parallel attention: only the rank holding the blocks reads
    for (int i = 0; i < n; ++i) {
      const int32_t local = read.local_blocks(i);
      if (local >= 0 && local % options_.dp_size == options_.tp_rank) {
        blocks.emplace_back(read.source_blocks(i), local / options_.dp_size);
      }
    }
    return blocks;
  }
  // Only the id arithmetic of the layout is used (block size and interleave play no part).
  const DcpBlockLayout dcp = DcpBlockLayout::FromFlags(options_.dcp_size, 1, 1);
  const int64_t shard = dcp.ShardOfTpRank(options_.tp_rank);
  for (int i = 0; i < n; ++i) {
    const int32_t local = read.local_blocks(i);
    if (dcp.size == 1) {
      blocks.emplace_back(read.source_blocks(i), local);
    } else if (local >= 0 && dcp.ShardOfId(local) == shard) {
      blocks.emplace_back(read.source_blocks(i), static_cast<int32_t>(dcp.LocalId(local)));
    }
  }
  return blocks;
}

tandem::v1::RankGeometry RankKvEndpoint::geometry() const {
  absl::MutexLock lock(&mu_);
  return geometry_;
}

tandem::v1::CompatibilityInfo RankKvEndpoint::layout() const {
  absl::MutexLock lock(&mu_);
  return layout_;
}

kvtransfer::RankKvReader* RankKvEndpoint::reader() {
  absl::MutexLock lock(&mu_);
  return reader_.get();
}

std::string RankKvEndpoint::Handle(const tandem::v1::KvCommand& command) {
  return HandleCommand(command).SerializeAsString();
}

tandem::v1::KvReply RankKvEndpoint::HandleCommand(const tandem::v1::KvCommand& command) {
  tandem::v1::KvReply reply;
  absl::MutexLock lock(&mu_);
  if (reader_ == nullptr) {
    SetError(&reply, absl::FailedPreconditionError("this rank has no KV pool yet"));
    return reply;
  }
  if (command.describe()) {
    SetError(&reply, agent_->FillLocalDescriptor(reply.mutable_rank_descriptor()));
    *reply.mutable_rank_descriptor()->mutable_geometry() = geometry_;
  }
  for (const tandem::v1::KvSourceLink& link : command.links()) {
    SetError(&reply, reader_->AddSource(link.peer(), link.source()));
  }
  for (const tandem::v1::KvRead& read : command.reads()) {
    const std::vector<std::pair<int32_t, int32_t>> blocks = ShardBlocks(read);
    absl::Status posted;  // OK and nothing posted: none of the blocks is on this shard
    if (read.source_blocks_size() != read.local_blocks_size()) {
      posted = absl::InvalidArgumentError("KV read: block lists of different lengths");
    } else if (!blocks.empty()) {
      absl::StatusOr<kvtransfer::TransferId> id = reader_->PostRead(read.peer(), blocks);
      if (id.ok()) {
        reads_[read.id()] = *id;
        continue;
      }
      posted = id.status();
    }
    tandem::v1::KvReadEnd end;  // nothing posted: ended at once
    end.set_id(read.id());
    end.set_code(static_cast<int>(posted.code()));
    end.set_message(std::string(posted.message()));
    ended_.push_back(std::move(end));
  }
  for (uint64_t id : command.cancels()) {
    if (auto it = reads_.find(id); it != reads_.end()) reader_->Cancel(it->second);
  }
  if (command.sync_blocks_size() > 0) {
    // Group-wide ids; under data-parallel attention this rank syncs its own, as local ids.
    std::vector<int32_t> blocks;
    for (int32_t b : command.sync_blocks()) {
      if (options_.dp_size <= 1) {
        blocks.push_back(b);
      } else if (b >= 0 && b % options_.dp_size == options_.tp_rank) {
        blocks.push_back(b / options_.dp_size);
      }
    }
    SetError(&reply, reader_->SyncForRemoteRead(blocks));
  }
  if (command.poll()) {
    for (auto it = reads_.begin(); it != reads_.end();) {
      absl::StatusOr<bool> state = reader_->CheckTransfer(it->second);
      if (state.ok() && !*state) {
        ++it;
        continue;
      }
      tandem::v1::KvReadEnd end;
      end.set_id(it->first);
      end.set_code(static_cast<int>(state.status().code()));
      end.set_message(std::string(state.status().message()));
      ended_.push_back(std::move(end));
      reads_.erase(it++);
    }
  }
  for (tandem::v1::KvReadEnd& end : ended_) *reply.add_ended() = std::move(end);
  ended_.clear();
  const kvtransfer::RankKvReaderStats stats = reader_->stats();
  reply.set_bytes_read(stats.bytes_read);
  reply.set_bytes_kept(stats.bytes_kept);
  reply.set_copy_ops(stats.copy_ops);
  return reply;
}

GroupBlockTransport::GroupBlockTransport(std::shared_ptr<GroupChannel> channel,
                                         RankKvEndpoint* local, absl::Duration poll_interval)
    : channel_(std::move(channel)), local_(local), poll_interval_(poll_interval) {
  const size_t n = static_cast<size_t>(channel_->size());
  stats_.bytes_read.assign(n, 0);
  stats_.bytes_kept.assign(n, 0);
  stats_.copy_ops.assign(n, 0);
}

absl::StatusOr<std::vector<tandem::v1::KvReply>> GroupBlockTransport::Call(
    const tandem::v1::KvCommand& command) {
  tandem::v1::RankCommand rank_command;
  *rank_command.mutable_kv() = command;
  ASSIGN_OR_RETURN(std::vector<std::string> raw,
                   channel_->Call(rank_command, [&] { return local_->Handle(command); }));
  std::vector<tandem::v1::KvReply> replies(raw.size());
  for (size_t r = 0; r < raw.size(); ++r) {
    if (!replies[r].ParseFromString(raw[r])) {
      return absl::InternalError(absl::StrCat("rank ", r, ": KV reply does not parse"));
    }
  }
  return replies;
}

absl::StatusOr<std::vector<tandem::v1::TransferHandshake>> GroupBlockTransport::DescribeRanks() {
  tandem::v1::KvCommand command;
  command.set_describe(true);
  ASSIGN_OR_RETURN(std::vector<tandem::v1::KvReply> replies, Call(command));
  std::vector<tandem::v1::TransferHandshake> ranks;
  for (size_t r = 0; r < replies.size(); ++r) {
    RETURN_IF_ERROR(ReplyStatus(replies[r], static_cast<int>(r)));
    ranks.push_back(replies[r].rank_descriptor());
  }
  return ranks;
}

absl::Status GroupBlockTransport::AddSource(const std::string& peer,
                                            const tandem::v1::TransferHandshake& source) {
  tandem::v1::KvCommand command;
  tandem::v1::KvSourceLink* link = command.add_links();
  link->set_peer(peer);
  *link->mutable_source() = source;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<tandem::v1::KvReply> replies, Call(command));
  ApplyEndsLocked(replies);
  for (size_t r = 0; r < replies.size(); ++r) {
    RETURN_IF_ERROR(ReplyStatus(replies[r], static_cast<int>(r)));
  }
  linked_.insert(peer);
  return absl::OkStatus();
}

bool GroupBlockTransport::SourceLinked(const std::string& peer) const {
  absl::MutexLock lock(&mu_);
  return linked_.contains(peer);
}

void GroupBlockTransport::ApplyEndsLocked(const std::vector<tandem::v1::KvReply>& replies) {
  for (size_t r = 0; r < replies.size(); ++r) {
    const tandem::v1::KvReply& reply = replies[r];
    stats_.bytes_read[r] = reply.bytes_read();
    stats_.bytes_kept[r] = reply.bytes_kept();
    stats_.copy_ops[r] = reply.copy_ops();
    for (const tandem::v1::KvReadEnd& end : reply.ended()) {
      auto it = reads_.find(end.id());
      if (it == reads_.end()) continue;
      it->second.ended[r] = true;
      if (end.code() == static_cast<int>(absl::StatusCode::kUnavailable)) {
        linked_.erase(it->second.peer);
      }
      if (end.code() != 0 && it->second.status.ok()) {
        it->second.status = absl::Status(static_cast<absl::StatusCode>(end.code()),
                                         absl::StrCat("rank ", r, ": ", end.message()));
      }
    }
  }
}

absl::StatusOr<kvtransfer::TransferId> GroupBlockTransport::PostRead(
    const std::string& peer, absl::Span<const std::pair<int32_t, int32_t>> blocks) {
  if (blocks.empty()) return absl::InvalidArgumentError("KV read of no blocks");
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  const kvtransfer::TransferId id = next_id_++;
  tandem::v1::KvCommand command;
  tandem::v1::KvRead* read = command.add_reads();
  read->set_id(id);
  read->set_peer(peer);
  for (const auto& [source, local] : blocks) {
    read->add_source_blocks(source);
    read->add_local_blocks(local);
  }
  reads_[id].ended.assign(static_cast<size_t>(channel_->size()), false);
  reads_[id].peer = peer;
  absl::StatusOr<std::vector<tandem::v1::KvReply>> replies = Call(command);
  if (!replies.ok()) {
    // Rank 0's part may be posted: the read ends (with the group's error) once it has ended.
    broken_ = replies.status();
    return id;
  }
  ApplyEndsLocked(*replies);
  return id;
}

absl::Status GroupBlockTransport::PollLocked() {
  tandem::v1::KvCommand command;
  command.set_poll(true);
  last_poll_ = absl::Now();
  ASSIGN_OR_RETURN(std::vector<tandem::v1::KvReply> replies, Call(command));
  ApplyEndsLocked(replies);
  // A part failed: stop the other ranks' parts (the read ends once they all have).
  tandem::v1::KvCommand cancel;
  for (auto& [id, read] : reads_) {
    if (!read.status.ok() && !read.cancel_sent) {
      cancel.add_cancels(id);
      read.cancel_sent = true;
    }
  }
  if (cancel.cancels_size() > 0) {
    ASSIGN_OR_RETURN(std::vector<tandem::v1::KvReply> more, Call(cancel));
    ApplyEndsLocked(more);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GroupBlockTransport::CheckTransfer(kvtransfer::TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = reads_.find(id);
  if (it == reads_.end()) return absl::NotFoundError(absl::StrCat("no KV read ", id));
  if (broken_.ok() && absl::Now() - last_poll_ >= poll_interval_) {
    if (absl::Status s = PollLocked(); !s.ok()) broken_ = s;
  }
  it = reads_.find(id);
  if (!broken_.ok()) {
    // The group is gone; only rank 0's own part can still write into rank 0's pool: stop it and
    // wait for its end (local, so bounded by the agent's cancel).
    tandem::v1::KvCommand stop;
    stop.add_cancels(id);
    stop.set_poll(true);
    for (int i = 0; i < 10000 && !it->second.ended[0]; ++i) {
      std::vector<tandem::v1::KvReply> mine(1);
      mine[0] = local_->HandleCommand(stop);
      for (const tandem::v1::KvReadEnd& end : mine[0].ended()) {
        if (end.id() == id) it->second.ended[0] = true;
      }
      if (!it->second.ended[0]) absl::SleepFor(absl::Microseconds(100));
    }
    reads_.erase(it);
    return broken_;
  }
  for (bool ended : it->second.ended) {
    if (!ended) return false;
  }
  absl::Status status = it->second.status;
  reads_.erase(it);
  if (!status.ok()) return status;
  return true;
}

void GroupBlockTransport::Cancel(kvtransfer::TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = reads_.find(id);
  if (it == reads_.end() || it->second.cancel_sent || !broken_.ok()) return;
  it->second.cancel_sent = true;
  tandem::v1::KvCommand command;
  command.add_cancels(id);
  absl::StatusOr<std::vector<tandem::v1::KvReply>> replies = Call(command);
  if (!replies.ok()) {
    broken_ = replies.status();
    return;
  }
  ApplyEndsLocked(*replies);
}

absl::Status GroupBlockTransport::SyncForRemoteRead(absl::Span<const int32_t> block_ids) {
  if (block_ids.empty()) return absl::OkStatus();
  tandem::v1::KvCommand command;
  for (int32_t b : block_ids) command.add_sync_blocks(b);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<tandem::v1::KvReply> replies, Call(command));
  ApplyEndsLocked(replies);
  for (size_t r = 0; r < replies.size(); ++r) {
    RETURN_IF_ERROR(ReplyStatus(replies[r], static_cast<int>(r)));
  }
  return absl::OkStatus();
}

GroupKvStats GroupBlockTransport::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tandem::runtime
