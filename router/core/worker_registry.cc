#include "router/core/worker_registry.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "common/logging.h"
#include "common/security/auth_status.h"
#include "router/core/validation.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

bool Routable(v1::ServingStatus status) {
  return status == v1::SERVING_STATUS_SERVING || status == v1::SERVING_STATUS_UNSPECIFIED;
}

std::vector<uint64_t> ShortChain(absl::Span<const uint32_t> prompt, uint32_t block_size,
                                 const std::string& salt) {
  // Token ids were validated against the vocabulary; the worker hashes the same int32 values.
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<BlockHash> hashes = ComputeBlockHashes(tokens, block_size, salt);
  std::vector<uint64_t> chain;
  chain.reserve(hashes.size());
  for (const BlockHash& h : hashes) chain.push_back(h.Short());
  return chain;
}

// The certificate role that may claim a worker of `role`.
std::optional<security::Role> CertRoleFor(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return security::Role::kPrefill;
    case v1::WORKER_ROLE_DECODE:
      return security::Role::kDecode;
    case v1::WORKER_ROLE_MIXED:
      return security::Role::kMixed;
    default:
      return std::nullopt;
  }
}

// The identity with which `caller` speaks for `worker_id` ("" without TLS): its certificate must
// name that worker (and be of `role` when given). PERMISSION_DENIED (generic) otherwise.
absl::StatusOr<std::string> ClaimantOf(const RegistryCaller& caller, const std::string& worker_id,
                                       std::optional<v1::WorkerRole> role) {
  if (!caller.peer.has_value()) return std::string();
  const security::PeerIdentity& peer = *caller.peer;
  if (peer.worker_id.empty()) {
    return security::PermissionDenied(absl::StrCat(
        peer.ToString(), " (a role-only certificate) speaking for worker ", worker_id));
  }
  if (peer.worker_id != worker_id) {
    return security::PermissionDenied(
        absl::StrCat(peer.ToString(), " speaking for worker ", worker_id));
  }
  if (role.has_value() && CertRoleFor(*role) != peer.role) {
    return security::PermissionDenied(
        absl::StrCat(peer.ToString(), " registering as role ", v1::WorkerRole_Name(*role)));
  }
  return security::IdentityUri(peer.role, peer.worker_id);
}

// FAILED_PRECONDITION when `epoch` (Unix microseconds) is more than `ahead` past `now`.
absl::Status CheckEpochNotAhead(const v1::WorkerInfo& info, absl::Time now, absl::Duration ahead) {
  const int64_t limit = absl::ToUnixMicros(now + ahead);
  if (limit >= 0 && info.epoch() <= static_cast<uint64_t>(limit)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("worker ", info.worker_id(), " registered with epoch ", info.epoch(),
                   ", more than ", absl::FormatDuration(ahead),
                   " ahead of the router's clock (epochs are start times in Unix microseconds)"));
}

}  // namespace

WorkerRegistry::WorkerRegistry(RegistryOptions options, Clock clock, WorkerClientFactory clients)
    : options_(std::move(options)), clock_(std::move(clock)), clients_(std::move(clients)) {}

absl::Status WorkerRegistry::Register(const v1::WorkerInfo& info, const RegistryCaller& caller) {
  if (absl::Status s = ValidateWorkerInfo(info); !s.ok()) return s;
  absl::StatusOr<std::string> owner = ClaimantOf(caller, info.worker_id(), info.role());
  if (!owner.ok()) return owner.status();
  const absl::Time now = clock_();
  if (absl::Status s = CheckEpochNotAhead(info, now, options_.max_epoch_ahead); !s.ok()) return s;
  std::shared_ptr<WorkerClient> client = clients_ ? clients_(info.address()) : nullptr;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(info.worker_id());
  if (it != workers_.end()) {
    Entry& old = *it->second;
    if (old.owner != *owner && !old.timed_out) {
      return security::PermissionDenied(absl::StrCat("worker ", info.worker_id(), " is live as ",
                                                     old.owner, "; ", *owner,
                                                     " may not replace it"));
    }
    if (info.epoch() == old.info.epoch() && info.address() == old.info.address() &&
        old.owner == *owner) {
      // A retried registration (the reply was lost): keep the index and the channel.
      old.info = info;
      old.last_heartbeat = now;
      old.timed_out = false;
      return absl::OkStatus();
    }
    if (info.epoch() <= old.info.epoch()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", info.worker_id(), " registered with epoch ", info.epoch(),
                       ", not newer than its current epoch ", old.info.epoch()));
    }
  }
  auto entry = std::make_unique<Entry>(options_.prefix_index_max_blocks);
  entry->info = info;
  entry->owner = *std::move(owner);
  entry->client = std::move(client);
  entry->last_heartbeat = now;
  LOG(INFO) << "worker " << info.worker_id() << " registered: role "
            << v1::WorkerRole_Name(info.role()) << ", epoch " << info.epoch() << ", address "
            << info.address() << ", model " << info.model_id();
  workers_[info.worker_id()] = std::move(entry);
  return absl::OkStatus();
}

absl::StatusOr<bool> WorkerRegistry::Heartbeat(const v1::HeartbeatRequest& request,
                                               const RegistryCaller& caller) {
  if (absl::Status s = ValidateHeartbeat(request); !s.ok()) return s;
  absl::StatusOr<std::string> owner = ClaimantOf(caller, request.worker_id(), std::nullopt);
  if (!owner.ok()) return owner.status();
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) return false;
  Entry& e = *it->second;
  if (e.owner != *owner) {
    return security::PermissionDenied(
        absl::StrCat(*owner, " heartbeating for worker ", request.worker_id(), " of ", e.owner));
  }
  if (e.info.epoch() != request.epoch()) return false;
  e.last_heartbeat = now;
  e.status = request.status();
  e.load = request.load();
  e.index.Remove(request.removed_block_hashes());
  e.index.Add(request.added_block_hashes());
  if (e.timed_out) {
    e.timed_out = false;
    LOG(INFO) << "worker " << request.worker_id() << " heartbeats again: re-admitted";
  }
  if (e.failed && now >= e.failed_until) {
    e.failed = false;
    LOG(INFO) << "worker " << request.worker_id() << " re-admitted after its failure backoff";
  }
  return true;
}

RoutingSnapshot WorkerRegistry::Snapshot(absl::Span<const uint32_t> prompt,
                                         const std::string& cache_salt) const {
  RoutingSnapshot snap;
  absl::flat_hash_set<uint32_t> block_sizes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : workers_) {
      if (e->info.role() != v1::WORKER_ROLE_DECODE) block_sizes.insert(e->info.block_size());
    }
  }
  // SHA-256 over the prompt: outside the lock.
  for (uint32_t bs : block_sizes) snap.chains[bs] = ShortChain(prompt, bs, cache_salt);

  absl::MutexLock lock(&mu_);
  snap.registered = static_cast<int>(workers_.size());
  for (const auto& [id, e] : workers_) {
    if (e->failed && !e->timed_out && Routable(e->status)) ++snap.in_backoff;
    if (!e->healthy() || !Routable(e->status)) continue;
    RouteCandidate c;
    c.worker_id = id;
    c.role = e->info.role();
    c.model_id = e->info.model_id();
    c.kv_layout_hash = e->info.kv_layout_hash();
    c.kv_dtype = e->info.kv_dtype();
    c.load = std::max<int64_t>(int64_t{e->load.num_running()} + int64_t{e->load.num_waiting()},
                               e->in_flight);
    c.free_blocks = e->load.kv_blocks_free();
    auto chain = snap.chains.find(e->info.block_size());
    if (c.role != v1::WORKER_ROLE_DECODE && chain != snap.chains.end()) {
      c.cached_tokens =
          static_cast<int64_t>(e->index.MatchPrefix(chain->second)) * e->info.block_size();
    }
    snap.candidates.push_back(std::move(c));
  }
  return snap;
}

absl::StatusOr<WorkerRef> WorkerRegistry::BeginCall(const std::string& worker_id,
                                                    const RoutingSnapshot* snapshot) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is no longer registered"));
  }
  Entry& e = *it->second;
  ++e.in_flight;
  if (snapshot != nullptr && e.info.role() != v1::WORKER_ROLE_DECODE) {
    auto chain = snapshot->chains.find(e.info.block_size());
    if (chain != snapshot->chains.end()) e.index.Add(chain->second);
  }
  return WorkerRef{e.info, e.client, clock_()};
}

void WorkerRegistry::EndCall(const WorkerRef& worker, bool worker_failed, absl::string_view error,
                             bool link_down) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker.info.worker_id());
  if (it == workers_.end() || it->second->info.epoch() != worker.info.epoch()) return;
  Entry& e = *it->second;
  e.in_flight = std::max<int64_t>(e.in_flight - 1, 0);
  if (!worker_failed) {
    e.consecutive_failures = 0;
    return;
  }
  e.consecutive_failures = std::min(e.consecutive_failures + 1, 30);
  absl::Duration backoff = options_.heartbeat_interval;
  for (int i = 1; i < e.consecutive_failures && backoff < options_.max_failure_backoff; ++i) {
    backoff *= 2;
  }
  backoff = std::min(backoff, options_.max_failure_backoff);
  e.failed = true;
  e.link_down = link_down;
  e.failed_at = now;
  e.failed_until = now + backoff;
  LOG(WARNING) << "worker " << worker.info.worker_id() << " marked unhealthy for "
               << absl::FormatDuration(backoff) << ": " << error;
}

int WorkerRegistry::ReadmitReconnected() {
  struct HeldOut {
    std::string id;
    uint64_t epoch;
    std::shared_ptr<WorkerClient> client;
  };
  std::vector<HeldOut> held_out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : workers_) {
      if (e->failed && e->link_down && !e->timed_out && e->client != nullptr) {
        held_out.push_back({id, e->info.epoch(), e->client});
      }
    }
  }
  std::erase_if(held_out, [](const HeldOut& w) { return !w.client->Connected(); });
  int readmitted = 0;
  absl::MutexLock lock(&mu_);
  for (const HeldOut& w : held_out) {
    auto it = workers_.find(w.id);
    if (it == workers_.end() || it->second->info.epoch() != w.epoch || !it->second->failed ||
        !it->second->link_down) {
      continue;  // gone, replaced, re-admitted meanwhile, or failed again with its link up
    }
    it->second->failed = false;
    ++readmitted;
    LOG(INFO) << "worker " << w.id << " is connected again: re-admitted before its backoff ended";
  }
  return readmitted;
}

void WorkerRegistry::Answered(const WorkerRef& worker) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker.info.worker_id());
  if (it == workers_.end() || it->second->info.epoch() != worker.info.epoch()) return;
  Entry& e = *it->second;
  if (!e.failed || worker.begun < e.failed_at) return;
  e.failed = false;
  e.consecutive_failures = 0;
  LOG(INFO) << "worker " << worker.info.worker_id()
            << " answered a call made after its failure: re-admitted";
}

std::vector<std::string> WorkerRegistry::CheckTimeouts() {
  const absl::Time now = clock_();
  std::vector<std::string> lost;
  absl::MutexLock lock(&mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    Entry& e = *it->second;
    const absl::Duration silent = now - e.last_heartbeat;
    if (silent > options_.forget_after) {
      LOG(INFO) << "worker " << it->first << " silent for " << absl::FormatDuration(silent)
                << ": forgotten";
      workers_.erase(it++);
      continue;
    }
    if (!e.timed_out && silent > options_.worker_timeout) {
      e.timed_out = true;
      LOG(WARNING) << "worker " << it->first << " missed heartbeats for "
                   << absl::FormatDuration(silent) << ": unhealthy";
      lost.push_back(it->first);
    }
    ++it;
  }
  return lost;
}

v1::ListWorkersResponse WorkerRegistry::List() const {
  v1::ListWorkersResponse out;
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> sorted;
  for (const auto& [id, e] : workers_) sorted.push_back(e.get());
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->info.worker_id() < b->info.worker_id();
  });
  for (const Entry* e : sorted) {
    v1::WorkerEntry* w = out.add_workers();
    *w->mutable_info() = e->info;
    w->set_status(e->status);
    *w->mutable_load() = e->load;
    w->set_healthy(e->healthy());
    w->set_last_heartbeat_unix_ms(absl::ToUnixMillis(e->last_heartbeat));
  }
  return out;
}

WorkerRegistry::ModelLimits WorkerRegistry::Limits() const {
  ModelLimits limits;
  bool any = false;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : workers_) {
    if (!e->healthy() || !Routable(e->status)) continue;
    limits.vocab_size =
        any ? std::min(limits.vocab_size, e->info.vocab_size()) : e->info.vocab_size();
    limits.max_model_len =
        any ? std::min(limits.max_model_len, e->info.max_model_len()) : e->info.max_model_len();
    any = true;
  }
  return limits;
}

}  // namespace tandem::router
