#include "runtime/worker/router_registration.h"

#include <algorithm>
#include <utility>

#include "common/grpc_keepalive.h"
#include "common/security/grpc_security.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/limits.h"

namespace tandem::runtime {

RouterRegistration::RouterRegistration(std::string router_address,
                                       const security::SecurityConfig& security,
                                       RegistrationCallbacks callbacks,
                                       absl::Duration retry_interval)
    : router_address_(std::move(router_address)),
      callbacks_(std::move(callbacks)),
      retry_interval_(retry_interval) {
  grpc::ChannelArguments args;
  EnableKeepalive(args);  // a lost link to the router is noticed in ~1-2 s
  stub_ = tandem::v1::WorkerRegistry::NewStub(
      security::CreateChannel(router_address_, security, std::move(args)));
}

RouterRegistration::~RouterRegistration() { Stop(); }

void RouterRegistration::Start() {
  thread_ = std::thread([this] { Run(); });
}

void RouterRegistration::Stop() {
  if (!thread_.joinable()) return;
  stop_.Notify();
  HeartbeatNow();  // wakes the thread
  thread_.join();
}

void RouterRegistration::HeartbeatNow() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void RouterRegistration::WaitForNextBeat(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_; };
  mu_.AwaitWithTimeout(absl::Condition(&woken), timeout);
  wake_ = false;
}

bool RouterRegistration::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

bool RouterRegistration::Register() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  tandem::v1::RegisterWorkerRequest request;
  *request.mutable_info() = callbacks_.info();
  tandem::v1::RegisterWorkerResponse response;
  grpc::Status s = stub_->RegisterWorker(&context, request, &response);
  if (!s.ok()) {
    // The router unreachable is normal while it starts (retried quietly); a refusal is a
    // misconfiguration the operator must see (logged once per distinct message).
    const bool refused = s.error_code() != grpc::StatusCode::UNAVAILABLE &&
                         s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
    if (refused && s.error_message() != last_refusal_) {
      LOG(ERROR) << "the router " << router_address_
                 << " refused this worker's registration: " << s.error_message();
      last_refusal_ = s.error_message();
    } else {
      VLOG(1) << "register with router " << router_address_ << ": " << s.error_message();
    }
    return false;
  }
  heartbeat_interval_ =
      absl::Milliseconds(std::max<uint32_t>(response.heartbeat_interval_ms(), 50));
  LOG(INFO) << "registered with router " << router_address_ << " (heartbeat every "
            << heartbeat_interval_ << ")";
  return true;
}

bool RouterRegistration::Heartbeat(bool* known) {
  const absl::Time start = absl::Now();
  std::vector<uint64_t> added, removed;
  callbacks_.cache_events(&added, &removed);
  pending_added_.insert(pending_added_.end(), added.begin(), added.end());
  pending_removed_.insert(pending_removed_.end(), removed.begin(), removed.end());
  tandem::v1::HeartbeatRequest request;
  const tandem::v1::WorkerInfo info = callbacks_.info();
  request.set_worker_id(info.worker_id());
  request.set_epoch(info.epoch());
  request.set_status(callbacks_.status());
  *request.mutable_load() = callbacks_.load();
  // Bounded message: the rest goes with the next heartbeat.
  const size_t n_added =
      std::min<size_t>(pending_added_.size(), tandem::v1::kMaxHeartbeatBlockHashes);
  const size_t n_removed =
      std::min<size_t>(pending_removed_.size(), tandem::v1::kMaxHeartbeatBlockHashes);
  for (size_t i = 0; i < n_added; ++i) request.add_added_block_hashes(pending_added_[i]);
  for (size_t i = 0; i < n_removed; ++i) request.add_removed_block_hashes(pending_removed_[i]);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  tandem::v1::HeartbeatResponse response;
  const absl::Time sent = absl::Now();
  grpc::Status s = stub_->Heartbeat(&context, request, &response);
  if (absl::Now() - start > absl::Milliseconds(300)) {
    // Heartbeats must not wait for engine steps (EngineLoop snapshots): say so if they do.
    LOG(WARNING) << "slow heartbeat: prepared in " << (sent - start) << ", RPC took "
                 << (absl::Now() - sent);
  }
  if (!s.ok()) {
    VLOG(1) << "heartbeat to " << router_address_ << ": " << s.error_message();
    *known = true;  // keep trying with the same registration
    return false;
  }
  pending_added_.erase(pending_added_.begin(), pending_added_.begin() + n_added);
  pending_removed_.erase(pending_removed_.begin(), pending_removed_.begin() + n_removed);
  *known = response.known();
  return true;
}

void RouterRegistration::Run() {
  while (!stop_.HasBeenNotified()) {
    bool ok = false;
    {
      absl::MutexLock lock(&mu_);
      ok = registered_;
    }
    if (!ok) {
      if (Register()) {
        // A fresh registration starts the router's index empty: send the whole current set
        // (and drop older deltas, which it already contains).
        std::vector<uint64_t> added, removed;
        callbacks_.cache_events(&added, &removed);
        pending_added_ = callbacks_.all_cached_hashes();
        pending_removed_.clear();
        absl::MutexLock lock(&mu_);
        registered_ = true;
        continue;
      }
      stop_.WaitForNotificationWithTimeout(retry_interval_);
      continue;
    }
    bool known = true;
    Heartbeat(&known);
    if (!known) {
      LOG(WARNING) << "router " << router_address_ << " forgot this worker; registering again";
      absl::MutexLock lock(&mu_);
      registered_ = false;
      continue;
    }
    WaitForNextBeat(heartbeat_interval_);
  }
  // Last word: tell the router our status (DRAINING on shutdown) so it stops routing here.
  bool known = true;
  bool ok = false;
  {
    absl::MutexLock lock(&mu_);
    ok = registered_;
  }
  if (ok) Heartbeat(&known);
}

}  // namespace tandem::runtime
