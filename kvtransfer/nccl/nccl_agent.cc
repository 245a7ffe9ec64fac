#include "kvtransfer/nccl/nccl_agent.h"

#include <cuda_runtime_api.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent_internal.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace nccl_agent_internal {

NcclLinkOptions LinkOptions(const NcclAgentOptions& o) {
  NcclLinkOptions l;
  l.device = o.device;
  l.staging_chunk_bytes = o.staging_chunk_bytes;
  l.staging_buffers = o.staging_buffers;
  l.copy_ctas = o.copy_ctas;
  l.copy_mode = o.copy_mode;
  l.init_timeout = o.init_timeout;
  return l;
}

std::vector<nccl_plan::OpShape> OpShapes(absl::Span<const StridedCopyOp> ops) {
  std::vector<nccl_plan::OpShape> out;
  out.reserve(ops.size());
  for (const StridedCopyOp& op : ops) out.push_back({op.row_bytes, op.rows});
  return out;
}

}  // namespace nccl_agent_internal

namespace {

// Coalesced; ops whose rows follow each other on both sides become one row, so they may travel
// as direct messages (the plan sends strided ops only packed).
std::vector<StridedCopyOp> Normalized(absl::Span<const StridedCopyOp> ops) {
  std::vector<StridedCopyOp> out = CoalesceStridedCopyOps(ops);
  for (StridedCopyOp& op : out) {
    if (op.rows > 1 && op.local_stride == op.row_bytes && op.remote_stride == op.row_bytes) {
      op.row_bytes *= op.rows;  // validated: inside a region
      op.rows = 1;
      op.local_stride = op.remote_stride = op.row_bytes;
    }
  }
  return out;
}

}  // namespace

NcclAgent::NcclAgent(NcclAgentOptions options)
    : options_(std::move(options)),
      auth_(options_.control_token_key, options_.control_token_lifetime) {}

absl::StatusOr<std::unique_ptr<NcclAgent>> NcclAgent::Create(NcclAgentOptions options) {
  std::unique_ptr<NcclAgent> agent(new NcclAgent(std::move(options)));
  RETURN_IF_ERROR(agent->Init());
  return agent;
}

absl::Status NcclAgent::Init() {
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options_.device < 0 || options_.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl agent: device ", options_.device, " of ", count));
  }
  RETURN_IF_ERROR(auth_.Validate());
  const NcclAgentOptions& o = options_;
  if (o.staging_chunk_bytes == 0 || o.staging_buffers < 1 || o.direct_min_bytes == 0 ||
      o.copy_ctas < 1 || o.max_posted_transfers < 1 || o.init_timeout <= absl::ZeroDuration() ||
      o.transfer_timeout <= absl::ZeroDuration() || o.num_comms < 1 || o.num_comms > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl agent: bad options: staging_chunk_bytes ", o.staging_chunk_bytes,
        ", staging_buffers ", o.staging_buffers, ", direct_min_bytes ", o.direct_min_bytes,
        ", copy_ctas ", o.copy_ctas, ", max_posted_transfers ", o.max_posted_transfers,
        ", init_timeout ", absl::FormatDuration(o.init_timeout), ", transfer_timeout ",
        absl::FormatDuration(o.transfer_timeout), ", num_comms ", o.num_comms, " (1 or 2)"));
  }
  int port = 0;
  ASSIGN_OR_RETURN(listen_fd_,
                   nccl_socket::Listen(options_.control_host, options_.control_port, &port));
  address_ = nccl_wire::FormatAddress(options_.control_host, port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("nccl agent: eventfd failed");
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

NcclAgent::~NcclAgent() {
  std::vector<std::unique_ptr<Peer>> peers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [name, peer] : peers_) peers.push_back(std::move(peer));
    peers_.clear();
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  for (auto& peer : peers) StopPeer(peer.get());
  std::vector<std::unique_ptr<Served>> served;
  {
    absl::MutexLock lock(&mu_);
    served = std::move(served_);
  }
  for (auto& s : served) {
    s->stop = true;
    if (s->thread.joinable()) s->thread.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::StatusOr<uint32_t> NcclAgent::RegisterMemory(void* base, uint64_t length,
                                                   tandem::v1::MemoryKind kind) {
  if (kind != tandem::v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl agent registers CUDA device memory only, not kind ", kind));
  }
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("nccl agent: empty region");
  }
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= static_cast<size_t>(tandem::v1::kMaxMemoryRegions)) {
    return absl::ResourceExhaustedError("nccl agent: too many regions");
  }
  regions_.push_back({static_cast<char*>(base), length});
  return static_cast<uint32_t>(regions_.size() - 1);
}

absl::Status NcclAgent::FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) {
  absl::MutexLock lock(&mu_);
  handshake->set_transport(transport());
  handshake->set_worker_address(address_);
  handshake->clear_regions();
  for (const Region& r : regions_) {
    tandem::v1::MemoryRegion* region = handshake->add_regions();
    region->set_base_address(reinterpret_cast<uint64_t>(r.base));
    region->set_length(r.length);
    region->set_kind(tandem::v1::MEMORY_KIND_CUDA);
  }
  return absl::OkStatus();
}

absl::Status NcclAgent::AddPeer(const std::string& peer_name,
                                const tandem::v1::TransferHandshake& desc) {
  const std::string who = absl::StrCat("peer ", peer_name);
  if (desc.transport() != transport()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " speaks transport '", desc.transport(), "', not 'nccl'"));
  }
  if (desc.regions_size() > tandem::v1::kMaxMemoryRegions) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": too many regions"));
  }
  if (desc.access_token().size() > nccl_wire::kMaxHelloTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": access token too long"));
  }
  auto peer = std::make_unique<Peer>();
  peer->name = peer_name;
  peer->token = desc.access_token();
  absl::Status parsed = nccl_wire::ParseAddress(desc.worker_address(), &peer->host, &peer->port);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(who, ": ", parsed.message()));
  for (const tandem::v1::MemoryRegion& r : desc.regions()) {
    if (r.kind() != tandem::v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": region of kind ", r.kind()));
    }
    peer->remote_bytes.push_back(r.length());
  }
  Peer* p = peer.get();
  p->thread = std::thread([this, p] { PeerLoop(p); });
  absl::Status init;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Peer* q) { return q->ready; }, p));
    init = p->init_status;
  }
  if (!init.ok()) {
    p->stop = true;
    p->thread.join();
    return init;
  }
  std::unique_ptr<Peer> old;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      old = std::move(peer);
    } else {
      auto& slot = peers_[peer_name];
      old = std::move(slot);
      slot = std::move(peer);
      stats_.peers = peers_.size();
    }
  }
  if (old != nullptr) StopPeer(old.get());
  return absl::OkStatus();
}

void NcclAgent::StopPeer(Peer* peer) {
  peer->stop = true;
  if (peer->thread.joinable()) peer->thread.join();
}

void NcclAgent::RemovePeer(const std::string& peer_name) {
  std::unique_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer_name);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
    stats_.peers = peers_.size();
  }
  StopPeer(peer.get());
}

absl::StatusOr<NcclAgent::Peer*> NcclAgent::PostTargetLocked(const std::string& peer_name,
                                                             size_t num_ops,
                                                             std::vector<uint64_t>* local_bytes) {
  if (num_ops > nccl_wire::kMaxOpsPerRead) {
    return absl::InvalidArgumentError(absl::StrCat("nccl agent: batch of ", num_ops, " ops"));
  }
  auto it = peers_.find(peer_name);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("unknown peer ", peer_name));
  Peer* peer = it->second.get();
  if (!peer->failure.ok()) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer_name, " failed: ", peer->failure.message()));
  }
  for (const Region& r : regions_) local_bytes->push_back(r.length);
  return peer;
}

TransferId NcclAgent::QueueLocked(Peer* peer, std::vector<StridedCopyOp> ops) {
  auto t = std::make_unique<Transfer>();
  t->ops = std::move(ops);
  t->bytes = TotalBytes(t->ops);
  const TransferId id = transfers_.Add(std::move(t))->id;
  peer->queue.push_back(id);
  return id;
}

absl::StatusOr<TransferId> NcclAgent::PostRead(const std::string& peer_name,
                                               absl::Span<const CopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Peer * peer, PostTargetLocked(peer_name, ops.size(), &local_bytes));
  RETURN_IF_ERROR(ValidateCopyOps(ops, local_bytes, peer->remote_bytes));
  std::vector<StridedCopyOp> rows;
  rows.reserve(ops.size());
  for (const CopyOp& op : CoalesceCopyOps(ops)) rows.push_back(AsStrided(op));
  return QueueLocked(peer, std::move(rows));
}

bool NcclAgent::CanReadStrided(const std::string& peer_name, uint32_t local_region) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_name);
  return it != peers_.end() && it->second->failure.ok() && local_region < regions_.size();
}

absl::StatusOr<TransferId> NcclAgent::PostStridedRead(const std::string& peer_name,
                                                      absl::Span<const StridedCopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Peer * peer, PostTargetLocked(peer_name, ops.size(), &local_bytes));
  RETURN_IF_ERROR(ValidateStridedCopyOps(ops, local_bytes, peer->remote_bytes));
  return QueueLocked(peer, Normalized(ops));
}

void NcclAgent::EndLocked(Transfer* t, absl::Status result) {
  transfers_.End(*t, std::move(result), t->bytes, &stats_);
}

absl::StatusOr<bool> NcclAgent::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  return transfers_.Check(id);
}

void NcclAgent::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  Transfer* t = transfers_.Find(id);
  if (t == nullptr || t->ended) return;
  t->cancel = true;
  if (t->posted) return;  // NCCL ops cannot be withdrawn: ends CANCELLED once they finish
  for (auto& [name, peer] : peers_) {
    auto& q = peer->queue;
    for (auto qi = q.begin(); qi != q.end(); ++qi) {
      if (*qi == id) {
        q.erase(qi);
        break;
      }
    }
  }
  EndLocked(t, absl::CancelledError(absl::StrCat("transfer ", id, " cancelled")));
}

TransferAgentStats NcclAgent::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<nccl_plan::OpPlace> NcclAgent::OpPlaces(absl::Span<const StridedCopyOp> ops,
                                                    bool local) const {
  absl::MutexLock lock(&mu_);
  std::vector<nccl_plan::OpPlace> out;
  out.reserve(ops.size());
  for (const StridedCopyOp& op : ops) {
    const Region& r = regions_[local ? op.local_region : op.remote_region];
    out.push_back(
        {reinterpret_cast<uint64_t>(r.base) + (local ? op.local_offset : op.remote_offset),
         local ? op.local_stride : op.remote_stride});
  }
  return out;
}

}  // namespace tandem::kvtransfer
