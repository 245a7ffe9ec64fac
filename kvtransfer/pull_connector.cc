#include "kvtransfer/pull_connector.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kvtransfer/copy_ops.h"
#include "openssl/rand.h"

namespace tandem::kvtransfer {

PullKvConnector::PullKvConnector(TransferAgent* agent, const PullKvConnectorOptions& options)
    : owned_transport_(std::make_unique<AgentBlockTransport>(
          agent, options.local_region, options.remote_region, options.block_bytes)),
      transport_(owned_transport_.get()),
      options_(options),
      sink_(std::make_shared<RenewalSink>()) {
  absl::MutexLock lock(&sink_->mu);
  sink_->connector = this;
}

PullKvConnector::PullKvConnector(BlockTransport* transport, const PullKvConnectorOptions& options)
    : transport_(transport), options_(options), sink_(std::make_shared<RenewalSink>()) {
  absl::MutexLock lock(&sink_->mu);
  sink_->connector = this;
}

PullKvConnector::~PullKvConnector() {
  {
    absl::MutexLock lock(&sink_->mu);  // waits for a renewal callback in progress
    sink_->connector = nullptr;
  }
  // Cancel what is still in flight; the agent owns the transfers and ends them on destruction.
  absl::MutexLock lock(&mu_);
  for (auto& [id, load] : loads_) {
    if (load.transfer.has_value()) transport_->Cancel(*load.transfer);
  }
}

int64_t PullKvConnector::GetNumNewMatchedTokens(int64_t /*request_id*/, const RemoteKvSpec& remote,
                                                int64_t num_local_computed_tokens) {
  return std::max<int64_t>(0, remote.num_tokens - num_local_computed_tokens);
}

void PullKvConnector::UpdateStateAfterAlloc(int64_t request_id, const RemoteKvSpec& remote,
                                            absl::Span<const int32_t> block_table,
                                            int64_t num_local_computed_tokens) {
  const int64_t bs = options_.block_size;
  const int64_t first = num_local_computed_tokens / bs;
  const int64_t end = std::min<int64_t>({(remote.num_tokens + bs - 1) / bs,
                                         static_cast<int64_t>(remote.block_ids.size()),
                                         static_cast<int64_t>(block_table.size())});
  Load load;
  load.peer = remote.peer;
  load.deadline = remote.deadline;
  load.epoch = remote.epoch;
  load.lease_id = remote.lease_id;
  load.lease_deadline = remote.lease_deadline;
  load.renewer = remote.lease_client;
  for (int64_t i = first; i < end; ++i) {
    load.blocks.emplace_back(remote.block_ids[i], block_table[i]);
    load.local_blocks.push_back(block_table[i]);
  }
  load.bytes = load.blocks.size() * options_.block_bytes;
  absl::MutexLock lock(&mu_);
  loads_[request_id] = std::move(load);
  unstarted_.push_back(request_id);
}

ConnectorStepMeta PullKvConnector::BuildStepMeta() {
  ConnectorStepMeta meta;
  absl::MutexLock lock(&mu_);
  for (int64_t id : unstarted_) {
    auto it = loads_.find(id);
    if (it == loads_.end()) continue;  // cancelled before it started
    LoadSpec spec;
    spec.request_id = id;
    spec.peer = it->second.peer;
    spec.deadline = EffectiveDeadline(it->second);
    spec.blocks = it->second.blocks;
    meta.loads.push_back(std::move(spec));
  }
  unstarted_.clear();
  return meta;
}

std::optional<KvLease> PullKvConnector::RequestFinished(int64_t request_id,
                                                        const std::string& external_id,
                                                        bool hold_for_remote, int64_t num_blocks,
                                                        absl::Duration lease_duration) {
  if (!hold_for_remote || num_blocks <= 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  KvLease lease;
  lease.lease_id = NewLeaseIdLocked();
  lease.deadline = absl::Now() + lease_duration;
  leases_[lease.lease_id] =
      Lease{request_id, external_id, lease.deadline, num_blocks, std::nullopt};
  if (!external_id.empty()) lease_of_[external_id] = lease.lease_id;
  ++stats_.leases_granted;
  return lease;
}

uint64_t PullKvConnector::NewLeaseIdLocked() const {
  while (true) {
    uint64_t id = 0;
    // RAND_bytes fails only when OpenSSL cannot seed; a predictable id would be a security bug,
    // so that is fatal (like block_hash.cc's SHA-256).
    CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)), 1)
        << "RAND_bytes failed";
    if (id != 0 && !leases_.contains(id)) return id;
  }
}

void PullKvConnector::DropRemote(const RemoteKvSpec& remote) { ReleaseSourceLease(remote); }

void PullKvConnector::EraseLeaseLocked(absl::flat_hash_map<uint64_t, Lease>::iterator it) {
  if (!it->second.external_id.empty()) {
    auto named = lease_of_.find(it->second.external_id);
    if (named != lease_of_.end() && named->second == it->first) lease_of_.erase(named);
  }
  leases_.erase(it);
}

void PullKvConnector::QueueSourceReleaseLocked(const Load& load) {
  if (load.renewer == nullptr || load.lease_id == 0) return;
  source_releases_.push_back(SourceRelease{load.renewer, load.peer, load.epoch, load.lease_id});
}

void PullKvConnector::CancelLoad(int64_t request_id) {
  absl::MutexLock lock(&mu_);
  auto it = loads_.find(request_id);
  if (it == loads_.end()) return;
  Load& load = it->second;
  if (!load.transfer.has_value()) {
    // Never posted: nothing can write into its blocks.
    unstarted_.erase(std::remove(unstarted_.begin(), unstarted_.end(), request_id),
                     unstarted_.end());
    FailLoadLocked(request_id, load, absl::CancelledError("KV load cancelled"));
    loads_.erase(it);
    return;
  }
  if (load.cancel_reason.ok()) {
    load.cancel_reason = absl::CancelledError("KV load cancelled");
    transport_->Cancel(*load.transfer);
  }
}

bool PullKvConnector::ReleaseLease(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return false;
  released_.push_back(it->second.request_id);
  EraseLeaseLocked(it);
  ++stats_.leases_released;
  return true;
}

bool PullKvConnector::ReleaseLeaseOf(const std::string& external_id) {
  uint64_t lease_id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = lease_of_.find(external_id);
    if (it == lease_of_.end()) return false;
    lease_id = it->second;
  }
  return ReleaseLease(lease_id);
}

std::vector<ByteRange> PullKvConnector::BlocksToByteRanges(absl::Span<const int32_t> block_ids,
                                                           uint64_t block_bytes) {
  return kvtransfer::BlocksToByteRanges(block_ids, block_bytes);
}

absl::Status PullKvConnector::PrepareForRemoteRead(absl::Span<const int32_t> block_ids) {
  if (block_ids.empty()) return absl::OkStatus();
  return transport_->SyncForRemoteRead(block_ids);
}

std::optional<absl::Time> PullKvConnector::RenewLease(uint64_t lease_id, absl::Duration extend) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return std::nullopt;
  it->second.deadline = std::max(it->second.deadline, absl::Now() + extend);
  return it->second.deadline;
}

absl::Status PullKvConnector::BindLease(uint64_t lease_id, LeaseBinding binding) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", lease_id));
  Lease& lease = it->second;
  if (lease.binding.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " is bound already"));
  }
  if (static_cast<int64_t>(binding.block_ids.size()) != lease.num_blocks ||
      binding.num_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("lease ", lease_id, " holds ", lease.num_blocks,
                                                   " blocks, the binding names ",
                                                   binding.block_ids.size()));
  }
  lease.binding = std::move(binding);
  return absl::OkStatus();
}

absl::Status PullKvConnector::ReassignLease(const std::string& request_id, uint64_t lease_id,
                                            const std::string& reader) {
  absl::MutexLock lock(&mu_);
  auto named = lease_of_.find(request_id);
  auto it = leases_.find(lease_id);
  if (request_id.empty() || named == lease_of_.end() || named->second != lease_id ||
      it == leases_.end() || !it->second.binding.has_value() ||
      it->second.binding->request_id != request_id) {
    return absl::NotFoundError(
        absl::StrCat("request ", request_id, " holds no lease ", lease_id, " here"));
  }
  it->second.binding->reader = reader;
  return absl::OkStatus();
}

absl::Status PullKvConnector::AuthorizeLeaseUse(const LeaseUse& use) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(use.lease_id);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", use.lease_id));
  const std::optional<LeaseBinding>& bound = it->second.binding;
  if (!bound.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat("lease ", use.lease_id, " is not published"));
  }
  if (!bound->reader.empty() && use.reader != bound->reader) {
    return absl::PermissionDeniedError(absl::StrCat("lease ", use.lease_id, " is bound to ",
                                                    bound->reader, ", not to '", use.reader, "'"));
  }
  const LeaseBinding* shown = use.presented;
  if (shown != nullptr &&
      (shown->request_id != bound->request_id || shown->block_ids != bound->block_ids ||
       shown->num_tokens != bound->num_tokens)) {
    // A forged or edited handle: whatever its blocks, it reads nothing here.
    return absl::PermissionDeniedError(
        absl::StrCat("KV handle (request '", shown->request_id, "', ", shown->block_ids.size(),
                     " blocks) is not what lease ", use.lease_id, " was issued for"));
  }
  return absl::OkStatus();
}

bool PullKvConnector::HasLeaseFor(const std::string& reader) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, lease] : leases_) {
    if (lease.binding.has_value() &&
        (lease.binding->reader.empty() || lease.binding->reader == reader)) {
      return true;
    }
  }
  return false;
}

std::vector<CopyOp> PullKvConnector::BlocksToCopyOps(
    absl::Span<const std::pair<int32_t, int32_t>> blocks, const PullKvConnectorOptions& options) {
  return BlockPairsToCopyOps(blocks, options.local_region, options.remote_region,
                             options.block_bytes);
}

absl::Status PullKvConnector::StartLoad(const ConnectorStepMeta& meta) {
  absl::MutexLock lock(&mu_);
  for (const LoadSpec& spec : meta.loads) {
    auto it = loads_.find(spec.request_id);
    if (it == loads_.end() || it->second.transfer.has_value()) continue;
    Load& load = it->second;
    absl::StatusOr<TransferId> id = transport_->PostRead(spec.peer, spec.blocks);
    ++stats_.loads_started;
    if (!id.ok()) {
      // Nothing was posted, so nothing writes into the blocks: report at once.
      FailLoadLocked(spec.request_id, load, id.status());
      loads_.erase(it);
      continue;
    }
    load.transfer = *id;
    // Renew at half of the lease this load starts with (see the header comment).
    const absl::Time start = absl::Now();
    load.posted = start;
    if (load.renewer != nullptr && load.lease_id != 0 && load.lease_deadline > start &&
        load.lease_deadline != absl::InfiniteFuture()) {
      load.lease_length = load.lease_deadline - start;
      load.next_renewal = start + load.lease_length / 2;
    }
  }
  return absl::OkStatus();
}

absl::Time PullKvConnector::EffectiveDeadline(const Load& load) const {
  if (load.lease_deadline == absl::InfiniteFuture()) return load.deadline;
  return std::min(load.deadline, load.lease_deadline - options_.lease_safety_margin);
}

void PullKvConnector::CollectRenewalsLocked(absl::Time now, std::vector<Renewal>* out) {
  for (auto& [request_id, load] : loads_) {
    if (!load.transfer.has_value() || load.renewal_in_flight || now < load.next_renewal ||
        !load.cancel_reason.ok()) {
      continue;
    }
    load.renewal_in_flight = true;
    out->push_back(Renewal{request_id, *load.transfer, load.peer, load.epoch, load.lease_id,
                           load.lease_length, load.renewer});
  }
}

void PullKvConnector::SendRenewals(std::vector<Renewal> renewals) {
  for (Renewal& r : renewals) {
    std::shared_ptr<RenewalSink> sink = sink_;
    const int64_t request_id = r.request_id;
    const TransferId transfer = r.transfer;
    r.renewer->RenewLeaseAsync(r.peer, r.epoch, r.lease_id, r.extend,
                               [sink, request_id, transfer](absl::StatusOr<absl::Time> result) {
                                 absl::MutexLock lock(&sink->mu);
                                 if (sink->connector != nullptr) {
                                   sink->connector->OnLeaseRenewed(request_id, transfer, result);
                                 }
                               });
  }
}

void PullKvConnector::OnLeaseRenewed(int64_t request_id, TransferId transfer,
                                     const absl::StatusOr<absl::Time>& result) {
  absl::MutexLock lock(&mu_);
  auto it = loads_.find(request_id);
  if (it == loads_.end() || it->second.transfer != transfer) return;  // ended meanwhile
  Load& load = it->second;
  load.renewal_in_flight = false;
  const absl::Time now = absl::Now();
  if (result.ok()) {
    ++stats_.lease_renewals;
    load.lease_deadline = std::max(load.lease_deadline, *result);
    load.next_renewal = now + (load.lease_deadline - now) / 2;
    return;
  }
  if (result.status().code() == absl::StatusCode::kNotFound) {
    // The source dropped the lease: what is still to come may be another request's KV.
    if (load.cancel_reason.ok()) {
      load.cancel_reason = absl::FailedPreconditionError(
          absl::StrCat("source ", load.peer, " no longer holds lease ", load.lease_id, ": ",
                       result.status().message()));
      transport_->Cancel(transfer);
    }
    return;
  }
  load.next_renewal = now + load.lease_length / 8;  // retry; the old deadline still stands
}

void PullKvConnector::FailLoadLocked(int64_t request_id, Load& load, absl::Status status) {
  ++stats_.load_failures;
  // Counted, and said with its cause: a recompute must not hide a misconfigured transport.
  LOG(WARNING) << "KV load of request " << request_id << " (" << load.blocks.size()
               << " blocks from " << load.peer << ") failed: " << status;
  QueueSourceReleaseLocked(load);
  errors_.push_back(LoadError{request_id, std::move(status), std::move(load.local_blocks)});
}

FinishedTransfers PullKvConnector::GetFinished(absl::Time now) {
  FinishedTransfers done;
  std::vector<Renewal> renewals;
  std::vector<SourceRelease> releases;
  {
    absl::MutexLock lock(&mu_);
    CollectFinishedLocked(now, done);
    CollectRenewalsLocked(now, &renewals);
    releases.swap(source_releases_);
  }
  SendRenewals(std::move(renewals));
  for (const SourceRelease& r : releases) r.client->ReleaseLeaseAsync(r.peer, r.epoch, r.lease_id);
  return done;
}

void PullKvConnector::CollectFinishedLocked(absl::Time now, FinishedTransfers& done) {
  done.sending_done = std::move(released_);
  released_.clear();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline <= now) {
      done.sending_done.push_back(it->second.request_id);
      ++stats_.leases_expired;
      EraseLeaseLocked(it++);
    } else {
      ++it;
    }
  }
  std::vector<int64_t> ended;
  for (auto& [request_id, load] : loads_) {
    if (!load.transfer.has_value()) continue;
    if (now >= EffectiveDeadline(load) && load.cancel_reason.ok()) {
      load.cancel_reason = absl::DeadlineExceededError(
          absl::StrCat("KV load of ", load.blocks.size(), " blocks from ", load.peer,
                       now >= load.deadline ? " did not finish before its deadline"
                                            : " did not finish before the source's lease ran out"));
      transport_->Cancel(*load.transfer);
    }
    absl::StatusOr<bool> state = transport_->CheckTransfer(*load.transfer);
    if (state.ok() && !*state) continue;
    ended.push_back(request_id);
    if (state.ok() && load.cancel_reason.ok()) {
      QueueSourceReleaseLocked(load);
      done.receiving_done.push_back(request_id);
      ++stats_.loads_completed;
      stats_.bytes_loaded += load.bytes;
      // Not `now`: callers may pass a time taken before this step's StartLoad.
      const int64_t micros =
          std::max<int64_t>(0, absl::ToInt64Microseconds(absl::Now() - load.posted));
      stats_.load_micros += static_cast<uint64_t>(micros);
      load_records_[request_id] = {load.bytes, static_cast<uint64_t>(micros)};
      load_record_order_.push_back(request_id);
      while (load_record_order_.size() > kMaxLoadRecords) {
        load_records_.erase(load_record_order_.front());
        load_record_order_.pop_front();
      }
      load_seconds_.Observe(static_cast<double>(micros) / 1e6);
    } else {
      absl::Status why = !load.cancel_reason.ok() ? load.cancel_reason : state.status();
      FailLoadLocked(request_id, load, std::move(why));
    }
  }
  for (int64_t id : ended) loads_.erase(id);
}

std::optional<KvLoadRecord> PullKvConnector::TakeLoadRecord(int64_t request_id) {
  absl::MutexLock lock(&mu_);
  auto it = load_records_.find(request_id);
  if (it == load_records_.end()) return std::nullopt;
  KvLoadRecord record = it->second;
  load_records_.erase(it);  // its id stays in the order queue until it falls off
  return record;
}

std::vector<LoadError> PullKvConnector::GetLoadErrors() {
  absl::MutexLock lock(&mu_);
  std::vector<LoadError> errors = std::move(errors_);
  errors_.clear();
  return errors;
}

bool PullKvConnector::HasPendingLoads() const {
  absl::MutexLock lock(&mu_);
  return !loads_.empty() || !errors_.empty() || !released_.empty() || !source_releases_.empty();
}

KvConnectorStats PullKvConnector::Stats() const {
  absl::MutexLock lock(&mu_);
  KvConnectorStats stats = stats_;
  stats.load_seconds = load_seconds_.Snapshot();
  stats.leases_active = leases_.size();
  for (const auto& [id, lease] : leases_) stats.blocks_leased += lease.num_blocks;
  return stats;
}

}  // namespace tandem::kvtransfer
