#include "kvtransfer/testing/fault_injecting_agent.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kvtransfer {

void FaultInjectingAgent::SetFaults(Faults faults) {
  absl::MutexLock lock(&mu_);
  default_faults_ = std::move(faults);
}

void FaultInjectingAgent::SetPeerFaults(const std::string& peer, Faults faults) {
  absl::MutexLock lock(&mu_);
  peer_faults_[peer] = std::move(faults);
}

void FaultInjectingAgent::ClearFaults() {
  absl::MutexLock lock(&mu_);
  default_faults_ = Faults{};
  peer_faults_.clear();
}

void FaultInjectingAgent::KillPeer(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  dead_peers_.insert(peer);
  ForceEndLocked(peer, absl::UnavailableError(absl::StrCat("peer ", peer, " died (injected)")));
}

void FaultInjectingAgent::RevivePeer(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  dead_peers_.erase(peer);
}

absl::Status FaultInjectingAgent::AddPeer(const std::string& peer_name,
                                          const tandem::v1::TransferHandshake& peer) {
  absl::Status s = base_->AddPeer(peer_name, peer);
  if (s.ok()) RevivePeer(peer_name);
  return s;
}

void FaultInjectingAgent::RemovePeer(const std::string& peer_name) {
  absl::MutexLock lock(&mu_);
  base_->RemovePeer(peer_name);  // base ends its transfers to the peer with CANCELLED
  ForceEndLocked(peer_name, absl::CancelledError(absl::StrCat("peer ", peer_name, " was removed")));
}

FaultInjectingAgent::Faults FaultInjectingAgent::TakeFaultsLocked(const std::string& peer) {
  auto it = peer_faults_.find(peer);
  Faults* faults = it != peer_faults_.end() ? &it->second : &default_faults_;
  if (faults->count == 0) return Faults{};
  if (faults->count > 0) --faults->count;
  return *faults;
}

void FaultInjectingAgent::ForceEndLocked(const std::string& peer, const absl::Status& reason) {
  for (auto& [id, t] : transfers_) {
    if (t.peer != peer || !t.forced_end.ok()) continue;
    t.forced_end = reason;
    if (t.base_id.has_value() && !t.base_ended) base_->Cancel(*t.base_id);
  }
}

absl::StatusOr<TransferId> FaultInjectingAgent::PostRead(const std::string& peer_name,
                                                         absl::Span<const CopyOp> ops) {
  absl::MutexLock lock(&mu_);
  const Faults faults = TakeFaultsLocked(peer_name);
  if (!faults.post_error.ok()) return faults.post_error;
  Transfer t;
  t.peer = peer_name;
  for (const CopyOp& op : ops) t.bytes += op.length;
  std::vector<CopyOp> posted(ops.begin(), ops.end());
  if (faults.fail_after_bytes.has_value()) {
    // Keep exactly the first N bytes, in op order.
    uint64_t left = *faults.fail_after_bytes;
    std::vector<CopyOp> prefix;
    for (CopyOp op : posted) {
      if (left == 0) break;
      op.length = std::min(op.length, left);
      left -= op.length;
      prefix.push_back(op);
    }
    posted = std::move(prefix);
    t.injected_failure =
        faults.failure.ok() ? absl::UnavailableError("injected failure") : faults.failure;
  }
  if (dead_peers_.contains(peer_name)) {
    // A dead peer sends nothing: post nothing (so only the empty-batch check applies).
    if (ops.empty()) return absl::InvalidArgumentError("empty copy batch");
    t.forced_end = absl::UnavailableError(absl::StrCat("peer ", peer_name, " died (injected)"));
    posted.clear();
  }
  // The base agent validates the batch (unknown peer, ranges), so errors match the real ones.
  if (!posted.empty()) {
    absl::StatusOr<TransferId> base_id = base_->PostRead(peer_name, posted);
    if (!base_id.ok()) return base_id.status();
    t.base_id = *base_id;
  } else if (ops.empty()) {
    return absl::InvalidArgumentError("empty copy batch");
  }
  t.dropped = faults.drop;
  t.not_before = absl::Now() + faults.delay;
  const TransferId id = next_id_++;
  transfers_.emplace(id, std::move(t));
  return id;
}

absl::StatusOr<bool> FaultInjectingAgent::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown or already ended transfer ", id));
  }
  Transfer& t = it->second;
  // Nothing ends before the base transfer ended: only then are its local ranges quiet.
  if (t.base_id.has_value() && !t.base_ended) {
    absl::StatusOr<bool> done = base_->CheckTransfer(*t.base_id);
    if (done.ok() && !*done) return false;
    t.base_ended = true;
    t.base_result = done.status();
  }
  absl::Status result;
  if (!t.forced_end.ok()) {
    result = t.forced_end;
  } else if (t.dropped) {
    if (!t.cancelled) return false;  // a lost completion: only Cancel & co. end it
    result = absl::CancelledError(absl::StrCat("transfer ", id, " cancelled"));
  } else if (!t.base_result.ok()) {
    result = t.base_result;
  } else if (t.cancelled && !t.base_id.has_value()) {
    result = absl::CancelledError(absl::StrCat("transfer ", id, " cancelled"));
  } else if (!t.injected_failure.ok()) {
    result = t.injected_failure;
  } else if (!t.cancelled && absl::Now() < t.not_before) {
    return false;
  }
  if (result.ok()) {
    ++stats_.transfers_completed;
    stats_.bytes_read += t.bytes;
  } else {
    ++stats_.transfers_failed;
  }
  transfers_.erase(it);
  if (!result.ok()) return result;
  return true;
}

void FaultInjectingAgent::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  t.cancelled = true;
  // The base decides between CANCELLED and OK (finished first), as the contract allows.
  if (t.base_id.has_value() && !t.base_ended) base_->Cancel(*t.base_id);
}

TransferAgentStats FaultInjectingAgent::Stats() const {
  absl::MutexLock lock(&mu_);
  TransferAgentStats stats = stats_;
  stats.peers = base_->Stats().peers;
  return stats;
}

}  // namespace tandem::kvtransfer
