#include "kvtransfer/inprocess/inprocess_agent.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvtransfer/copy_ops.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace inprocess_internal {

// One agent as the fabric sees it. Other agents' copy threads read `regions` memory only under
// a reader lock of `mu` with `alive` set, so taking `mu` exclusively to clear `alive` waits out
// every reader: after that the memory is never touched again.
struct Endpoint {
  explicit Endpoint(std::string address) : address(std::move(address)) {}

  const std::string address;  // "<name>#<incarnation>", what descriptors carry
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  // Lock-free copy of `alive` for the checks that only need a hint (the copy loop's scan).
  std::atomic<bool> alive_hint{true};
  struct Region {
    char* base;
    uint64_t length;
  };
  std::vector<Region> regions ABSL_GUARDED_BY(mu);

  void MarkDead() {
    absl::MutexLock lock(&mu);
    alive = false;
    alive_hint.store(false);
  }
};

}  // namespace inprocess_internal

using inprocess_internal::Endpoint;

// ---------------------------------------------------------------------------------------------
// InProcessFabric

bool InProcessFabric::Kill(const std::string& name) {
  std::shared_ptr<Endpoint> endpoint;
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return false;
    endpoint = std::move(it->second);
    agents_.erase(it);
  }
  endpoint->MarkDead();  // outside mu_: waits for in-progress chunk copies
  return true;
}

void InProcessFabric::Attach(const std::string& name, std::shared_ptr<Endpoint> endpoint) {
  std::shared_ptr<Endpoint> old;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Endpoint>& slot = agents_[name];
    old = std::move(slot);
    slot = std::move(endpoint);
  }
  if (old != nullptr) old->MarkDead();
}

void InProcessFabric::Detach(const std::string& name, const Endpoint* endpoint) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(name);
  if (it != agents_.end() && it->second.get() == endpoint) agents_.erase(it);
}

std::shared_ptr<Endpoint> InProcessFabric::Find(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(name);
  return it == agents_.end() ? nullptr : it->second;
}

uint64_t InProcessFabric::NextIncarnation() {
  absl::MutexLock lock(&mu_);
  return next_incarnation_++;
}

// ---------------------------------------------------------------------------------------------
// InProcessAgent

InProcessAgent::InProcessAgent(std::shared_ptr<InProcessFabric> fabric, std::string name,
                               InProcessAgentOptions options)
    : fabric_(std::move(fabric)),
      name_(std::move(name)),
      options_(options),
      self_(std::make_shared<Endpoint>(absl::StrCat(name_, "#", fabric_->NextIncarnation()))) {
  fabric_->Attach(name_, self_);
  copy_thread_ = std::thread([this] { CopyLoop(); });
}

InProcessAgent::~InProcessAgent() {
  fabric_->Detach(name_, self_.get());
  self_->MarkDead();  // no other agent reads our memory after this
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  copy_thread_.join();  // nor do we write into it
}

absl::StatusOr<uint32_t> InProcessAgent::RegisterMemory(void* base, uint64_t length,
                                                        tandem::v1::MemoryKind kind) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory: null base or zero length");
  }
  if (kind != tandem::v1::MEMORY_KIND_HOST) {
    return absl::UnimplementedError(absl::StrCat("in-process agent supports host memory only, got ",
                                                 tandem::v1::MemoryKind_Name(kind)));
  }
  absl::MutexLock lock(&self_->mu);
  if (self_->regions.size() >= static_cast<size_t>(tandem::v1::kMaxMemoryRegions)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("at most ", tandem::v1::kMaxMemoryRegions, " memory regions"));
  }
  self_->regions.push_back({static_cast<char*>(base), length});
  return static_cast<uint32_t>(self_->regions.size() - 1);
}

absl::Status InProcessAgent::FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) {
  handshake->set_transport(transport());
  handshake->set_worker_address(self_->address);
  handshake->clear_regions();
  absl::ReaderMutexLock lock(&self_->mu);
  for (const Endpoint::Region& r : self_->regions) {
    tandem::v1::MemoryRegion* region = handshake->add_regions();
    region->set_base_address(reinterpret_cast<uint64_t>(r.base));
    region->set_length(r.length);
    region->set_kind(tandem::v1::MEMORY_KIND_HOST);
  }
  return absl::OkStatus();
}

absl::Status InProcessAgent::AddPeer(const std::string& peer_name,
                                     const tandem::v1::TransferHandshake& peer) {
  if (peer.transport() != transport()) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer_name, " speaks transport '",
                                                   peer.transport(), "', not 'inprocess'"));
  }
  const std::string& address = peer.worker_address();
  const size_t hash = address.rfind('#');
  if (hash == std::string::npos || hash == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer_name, ": malformed in-process address '", address, "'"));
  }
  if (peer.regions_size() > tandem::v1::kMaxMemoryRegions) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer_name, ": ", peer.regions_size(), " regions > limit"));
  }
  std::shared_ptr<Endpoint> endpoint = fabric_->Find(address.substr(0, hash));
  if (endpoint == nullptr || endpoint->address != address || !endpoint->alive_hint.load()) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer_name, ": no live agent at '", address, "'"));
  }
  Peer entry{.endpoint = std::move(endpoint), .region_bytes = {}};
  for (const tandem::v1::MemoryRegion& r : peer.regions()) entry.region_bytes.push_back(r.length());

  absl::MutexLock lock(&mu_);
  // Replacing a connection ends the transfers that used the old one, like RemovePeer.
  transfers_.ForEach([&](Transfer& t) {
    if (t.peer_name == peer_name && !t.ended && t.cancel_reason.ok()) {
      t.cancel_reason = absl::CancelledError(absl::StrCat("peer ", peer_name, " was re-added"));
    }
  });
  peers_[peer_name] = std::move(entry);
  cv_.SignalAll();
  return absl::OkStatus();
}

void InProcessAgent::RemovePeer(const std::string& peer_name) {
  absl::MutexLock lock(&mu_);
  if (peers_.erase(peer_name) == 0) return;
  transfers_.ForEach([&](Transfer& t) {
    if (t.peer_name == peer_name && !t.ended && t.cancel_reason.ok()) {
      t.cancel_reason = absl::CancelledError(absl::StrCat("peer ", peer_name, " was removed"));
    }
  });
  cv_.SignalAll();
}

absl::StatusOr<TransferId> InProcessAgent::PostRead(const std::string& peer_name,
                                                    absl::Span<const CopyOp> ops) {
  if (!self_->alive_hint.load()) {
    return absl::UnavailableError(absl::StrCat("agent ", name_, " was killed"));
  }
  std::vector<uint64_t> local_bytes;
  std::vector<char*> local_bases;
  {
    absl::ReaderMutexLock lock(&self_->mu);
    for (const Endpoint::Region& r : self_->regions) {
      local_bytes.push_back(r.length);
      local_bases.push_back(r.base);
    }
  }
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(peer_name);
  if (peer == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("PostRead: unknown peer '", peer_name, "'"));
  }
  if (absl::Status s = ValidateCopyOps(ops, local_bytes, peer->second.region_bytes); !s.ok()) {
    return s;
  }
  auto t = std::make_unique<Transfer>();
  t->peer_name = peer_name;
  t->source = peer->second.endpoint;
  t->ops = CoalesceCopyOps(ops);
  for (const CopyOp& op : t->ops) {
    t->dests.push_back(local_bases[op.local_region] + op.local_offset);
    t->total_bytes += op.length;
  }
  const TransferId id = transfers_.Add(std::move(t))->id;
  queue_.push_back(id);
  cv_.SignalAll();
  return id;
}

bool InProcessAgent::CanReadStrided(const std::string& peer_name, uint32_t local_region) {
  {
    absl::ReaderMutexLock lock(&self_->mu);
    if (local_region >= self_->regions.size()) return false;
  }
  absl::MutexLock lock(&mu_);
  return peers_.contains(peer_name);
}

absl::StatusOr<TransferId> InProcessAgent::PostStridedRead(const std::string& peer_name,
                                                           absl::Span<const StridedCopyOp> ops) {
  std::vector<uint64_t> local_bytes;
  {
    absl::ReaderMutexLock lock(&self_->mu);
    for (const Endpoint::Region& r : self_->regions) local_bytes.push_back(r.length);
  }
  {
    absl::MutexLock lock(&mu_);
    auto peer = peers_.find(peer_name);
    if (peer == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("PostStridedRead: unknown peer '", peer_name, "'"));
    }
    RETURN_IF_ERROR(ValidateStridedCopyOps(ops, local_bytes, peer->second.region_bytes));
  }
  std::vector<CopyOp> rows;
  for (const StridedCopyOp& op : ops) {
    for (uint64_t i = 0; i < op.rows; ++i) {
      rows.push_back(CopyOp{.local_region = op.local_region,
                            .local_offset = op.local_offset + i * op.local_stride,
                            .remote_region = op.remote_region,
                            .remote_offset = op.remote_offset + i * op.remote_stride,
                            .length = op.row_bytes});
    }
  }
  return PostRead(peer_name, rows);
}

absl::StatusOr<bool> InProcessAgent::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  return transfers_.Check(id);
}

void InProcessAgent::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  Transfer* t = transfers_.Find(id);
  if (t == nullptr || t->ended || !t->cancel_reason.ok()) return;
  t->cancel_reason = absl::CancelledError(absl::StrCat("transfer ", id, " cancelled"));
  cv_.SignalAll();
}

TransferAgentStats InProcessAgent::Stats() const {
  absl::MutexLock lock(&mu_);
  TransferAgentStats stats = stats_;
  stats.peers = peers_.size();
  return stats;
}

void InProcessAgent::HoldTransfers(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_ = hold;
  cv_.SignalAll();
}

void InProcessAgent::EndLocked(Transfer& t, absl::Status result) {
  transfers_.End(t, std::move(result), t.total_bytes, &stats_);
}

void InProcessAgent::CopyLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // End every queued transfer that must stop without moving more bytes.
    for (auto it = queue_.begin(); it != queue_.end();) {
      Transfer& t = *transfers_.Find(*it);
      absl::Status reason = t.cancel_reason;
      if (reason.ok() && !self_->alive_hint.load()) {
        reason = absl::UnavailableError(absl::StrCat("agent ", name_, " was killed"));
      }
      if (reason.ok() && !t.source->alive_hint.load()) {
        reason = absl::UnavailableError(
            absl::StrCat("peer ", t.peer_name, " (", t.source->address, ") is dead"));
      }
      if (reason.ok()) {
        ++it;
        continue;
      }
      EndLocked(t, std::move(reason));
      it = queue_.erase(it);
    }
    if (queue_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    if (hold_) {
      // Poll: peer death is not signalled to us, and must end held transfers too.
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(5));
      continue;
    }
    const TransferId id = queue_.front();
    Transfer* t = transfers_.Find(id);  // stable: only this thread ends and dequeues it
    mu_.Unlock();
    absl::Status status = CopyChunk(*t);
    if (options_.chunk_delay > absl::ZeroDuration()) absl::SleepFor(options_.chunk_delay);
    mu_.Lock();
    const bool finished = t->next_op == t->ops.size();
    if (!status.ok() || finished) {
      // A chunk that finished the copy wins over a Cancel that arrived meanwhile (all bytes are
      // in place; the contract allows OK after Cancel).
      EndLocked(*t, std::move(status));
      queue_.pop_front();
    }
  }
  // Destruction: remaining transfers die with the agent; nobody can observe them any more.
}

absl::Status InProcessAgent::CopyChunk(Transfer& t) {
  Endpoint& src = *t.source;
  absl::ReaderMutexLock lock(&src.mu);
  if (!src.alive) {
    return absl::UnavailableError(
        absl::StrCat("peer ", t.peer_name, " (", src.address, ") is dead"));
  }
  uint64_t budget = std::max<uint64_t>(options_.chunk_bytes, 1);
  while (budget > 0 && t.next_op < t.ops.size()) {
    const CopyOp& op = t.ops[t.next_op];
    // The descriptor's lengths were checked in PostRead; the live registration is what we read,
    // so check it again (a forged or stale descriptor must not make us read out of bounds).
    if (op.remote_region >= src.regions.size() ||
        op.remote_offset + op.length > src.regions[op.remote_region].length) {
      return absl::OutOfRangeError(absl::StrCat("peer ", t.peer_name, ": region ", op.remote_region,
                                                " smaller than its descriptor"));
    }
    const uint64_t n = std::min(budget, op.length - t.next_offset);
    std::memcpy(t.dests[t.next_op] + t.next_offset,
                src.regions[op.remote_region].base + op.remote_offset + t.next_offset, n);
    budget -= n;
    t.next_offset += n;
    if (t.next_offset == op.length) {
      ++t.next_op;
      t.next_offset = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
