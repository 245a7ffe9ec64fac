#include "kvtransfer/kv_transfer_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_keepalive.h"
#include "common/grpc_status.h"
#include "common/security/auth_status.h"
#include "common/security/grpc_security.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "kvtransfer/handshake.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

KvTransferServiceImpl::KvTransferServiceImpl(TransferAgent* agent, KvLeaseTable* leases,
                                             tandem::v1::TransferHandshake local,
                                             absl::Duration max_lease)
    : agent_(agent),
      local_(std::move(local)),
      leases_(leases, local_.worker_id(), local_.epoch(), max_lease) {
  absl::Status filled = agent_->FillLocalDescriptor(&local_);
  if (!filled.ok()) LOG(ERROR) << "transfer agent descriptor: " << filled;
}

namespace {

// The calling worker's id. On an mTLS plane (the peer presented a certificate the CA verified;
// an internal server accepts no other) it is the certificate's, and a request claiming another
// is refused; on a plain-text plane (--insecure) nothing is authenticated and the claim is all
// there is. PERMISSION_DENIED (opaque) for a certificate that names no worker.
absl::StatusOr<std::string> CallerWorkerId(const grpc::ServerContext& context,
                                           const std::string& claimed) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return claimed;
  absl::StatusOr<security::PeerIdentity> peer = security::PeerIdentityOf(*auth);
  if (!peer.ok()) return peer.status();
  if (peer->worker_id.empty()) {
    return security::PermissionDenied(
        absl::StrCat(peer->ToString(), ": a role certificate names no worker to bind leases to"));
  }
  if (!claimed.empty() && claimed != peer->worker_id) {
    return security::PermissionDenied(
        absl::StrCat(peer->ToString(), " claims to be worker ", claimed));
  }
  return peer->worker_id;
}

// A refused lease use as the caller sees it: NOT_FOUND (the lease is gone) stays, the rest says
// only "permission denied" (the reason is logged at VLOG 1).
absl::Status LeaseRefusal(const absl::Status& status) {
  if (status.ok() || absl::IsNotFound(status)) return status;
  return security::Opaque(status);
}

}  // namespace

grpc::Status KvTransferServiceImpl::Handshake(grpc::ServerContext* context,
                                              const tandem::v1::TransferHandshake* request,
                                              tandem::v1::TransferHandshakeResponse* response) {
  // Only a reader that holds a lease here learns how to reach this worker's pool: the transport
  // descriptor (UCX rkeys, the NCCL control socket) and a token for the NCCL socket.
  absl::StatusOr<std::string> caller = CallerWorkerId(*context, request->worker_id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!leases_.AcceptsHandshakeFrom(*caller)) {
    // Refused without the transport descriptor. The worker id and epoch (not secret) still tell
    // a reader holding a stale handle that this source restarted.
    VLOG(1) << "handshake from '" << *caller << "' refused: no live lease is bound to it";
    response->mutable_peer()->set_worker_id(local_.worker_id());
    response->mutable_peer()->set_epoch(local_.epoch());
    response->set_accepted(false);
    response->set_reason("no live KV lease here is bound to this worker");
    return grpc::Status::OK;
  }
  *response->mutable_peer() = local_;
  absl::Status compatible = CheckCompatible(local_, *request);
  if (compatible.code() == absl::StatusCode::kInvalidArgument) return ToGrpcStatus(compatible);
  if (!compatible.ok()) {
    response->set_accepted(false);
    response->set_reason(std::string(compatible.message()));
    return grpc::Status::OK;
  }
  // Pull mode: only the reader needs an endpoint to us, so the source just answers. A source
  // that also read (push mode) would AddPeer here. The token opens every rank's connection (the
  // ranks of a group verify it with the key they share: kvtransfer/nccl/nccl_agent_auth.h).
  const std::string token = agent_->IssueAccessToken();
  if (!token.empty()) {
    response->mutable_peer()->set_access_token(token);
    for (tandem::v1::TransferHandshake& rank : *response->mutable_peer()->mutable_ranks()) {
      rank.set_access_token(token);
    }
  }
  response->set_accepted(true);
  return grpc::Status::OK;
}

grpc::Status KvTransferServiceImpl::ReleaseLease(grpc::ServerContext* context,
                                                 const tandem::v1::ReleaseLeaseRequest* request,
                                                 tandem::v1::ReleaseLeaseResponse* response) {
  if (!leases_.IsThisIncarnation(request->worker_id(), request->epoch())) {
    response->set_released(false);  // a lease of another incarnation: already gone
    return grpc::Status::OK;
  }
  absl::StatusOr<std::string> caller = CallerWorkerId(*context, request->reader_worker_id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<bool> released =
      leases_.Release(request->worker_id(), request->epoch(), request->lease_id(), *caller);
  if (!released.ok()) return ToGrpcStatus(LeaseRefusal(released.status()));
  response->set_released(*released);
  return grpc::Status::OK;
}

grpc::Status KvTransferServiceImpl::RenewLease(grpc::ServerContext* context,
                                               const tandem::v1::RenewLeaseRequest* request,
                                               tandem::v1::RenewLeaseResponse* response) {
  if (!leases_.IsThisIncarnation(request->worker_id(), request->epoch())) {
    response->set_renewed(false);
    return grpc::Status::OK;
  }
  absl::StatusOr<std::string> caller = CallerWorkerId(*context, request->reader_worker_id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<std::optional<absl::Time>> deadline =
      leases_.Renew(request->worker_id(), request->epoch(), request->lease_id(), *caller,
                    absl::Milliseconds(request->extend_ms()));
  if (!deadline.ok()) return ToGrpcStatus(LeaseRefusal(deadline.status()));
  response->set_renewed(deadline->has_value());
  if (deadline->has_value()) response->set_lease_deadline_unix_ms(absl::ToUnixMillis(**deadline));
  return grpc::Status::OK;
}

grpc::Status KvTransferServiceImpl::AuthorizeRead(grpc::ServerContext* context,
                                                  const tandem::v1::AuthorizeReadRequest* request,
                                                  tandem::v1::AuthorizeReadResponse* /*response*/) {
  if (absl::Status ours = leases_.CheckHandle(request->handle()); !ours.ok()) {
    return ToGrpcStatus(ours);
  }
  absl::StatusOr<std::string> caller = CallerWorkerId(*context, request->reader_worker_id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(LeaseRefusal(leases_.AuthorizeRead(request->handle(), *caller)));
}

absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictKvTransferService(
    tandem::v1::KvTransferService::Service* service) {
  using S = tandem::v1::KvTransferService::Service;
  auto strict = std::make_unique<StrictParsingService>(
      tandem::v1::KvTransferService::service_full_name(), tandem::v1::kMaxGrpcMessageBytes);
  strict->Unary("Handshake", service, &S::Handshake)
      .Unary("ReleaseLease", service, &S::ReleaseLease)
      .Unary("RenewLease", service, &S::RenewLease)
      .Unary("AuthorizeRead", service, &S::AuthorizeRead);
  if (absl::Status s = strict->Complete(); !s.ok()) return s;
  return strict;
}

// The LeaseClient handed out by lease_client(): forwards to the PeerLinks while it lives.
class PeerLinks::Renewer final : public LeaseClient {
 public:
  explicit Renewer(PeerLinks* links) : links_(links) {}
  void Detach() {
    absl::MutexLock lock(&mu_);
    links_ = nullptr;
  }
  void RenewLeaseAsync(const std::string& peer, uint64_t epoch, uint64_t lease_id,
                       absl::Duration extend,
                       std::function<void(absl::StatusOr<absl::Time>)> done) override {
    absl::Status queued = absl::CancelledError("PeerLinks is gone");
    {
      absl::MutexLock lock(&mu_);
      if (links_ != nullptr) queued = links_->QueueRenewal(peer, epoch, lease_id, extend, done);
    }
    if (!queued.ok()) done(queued);  // outside the lock: `done` may take its own locks
  }
  void ReleaseLeaseAsync(const std::string& peer, uint64_t epoch, uint64_t lease_id) override {
    absl::MutexLock lock(&mu_);
    if (links_ != nullptr) links_->QueueRelease(peer, epoch, lease_id);
  }

 private:
  absl::Mutex mu_;
  PeerLinks* links_ ABSL_GUARDED_BY(mu_);
};

PeerLinks::PeerLinks(TransferAgent* agent, tandem::v1::TransferHandshake local,
                     security::SecurityConfig security, absl::Duration rpc_timeout,
                     SourceLinker linker, LinkCheck linked)
    : agent_(agent),
      local_(std::move(local)),
      security_(std::move(security)),
      rpc_timeout_(rpc_timeout),
      linker_(std::move(linker)),
      linked_(std::move(linked)),
      renewer_(std::make_shared<Renewer>(this)) {
  absl::Status filled = agent_->FillLocalDescriptor(&local_);
  if (!filled.ok()) LOG(ERROR) << "transfer agent descriptor: " << filled;
  releaser_ = std::thread([this] { ReleaseLoop(); });
}

PeerLinks::~PeerLinks() {
  renewer_->Detach();  // no new renewals
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  releaser_.join();
}

std::shared_ptr<LeaseClient> PeerLinks::lease_client() const { return renewer_; }

absl::Status PeerLinks::QueueRenewal(const std::string& peer, uint64_t epoch, uint64_t lease_id,
                                     absl::Duration extend,
                                     std::function<void(absl::StatusOr<absl::Time>)>& done) {
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::CancelledError("PeerLinks is stopping");
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::UnavailableError(absl::StrCat("no link to KV source ", peer));
  }
  if (it->second.epoch != epoch) {  // the source restarted: the lease died with it
    return absl::NotFoundError(absl::StrCat("KV source ", peer, " restarted (epoch ",
                                            it->second.epoch, ", lease of epoch ", epoch, ")"));
  }
  PendingRenewal renewal;
  renewal.stub = it->second.stub;
  renewal.request.set_worker_id(peer);
  renewal.request.set_epoch(epoch);
  renewal.request.set_lease_id(lease_id);
  renewal.request.set_reader_worker_id(local_.worker_id());
  renewal.request.set_extend_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(extend), 1, 10 * 60 * 1000)));
  renewal.done = std::move(done);
  renewals_.push_back(std::move(renewal));
  return absl::OkStatus();
}

void PeerLinks::SendRenewal(PendingRenewal renewal) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  tandem::v1::RenewLeaseResponse response;
  grpc::Status s = renewal.stub->RenewLease(&context, renewal.request, &response);
  if (!s.ok()) {
    renewal.done(FromGrpcStatus(s, absl::StrCat("RenewLease to ", renewal.request.worker_id())));
  } else if (!response.renewed()) {
    renewal.done(
        absl::NotFoundError(absl::StrCat("KV source ", renewal.request.worker_id(),
                                         " does not hold lease ", renewal.request.lease_id())));
  } else {
    renewal.done(absl::FromUnixMillis(response.lease_deadline_unix_ms()));
  }
}

// Attempts of one ReleaseLease RPC whose source did not answer (each bounded by rpc_timeout,
// 500 ms apart): about half a default lease.
constexpr int kReleaseAttempts = 4;

void PeerLinks::ReleaseLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || !releases_.empty() || !renewals_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (!renewals_.empty()) {  // renewals first: a load is waiting on each
      PendingRenewal next = std::move(renewals_.front());
      renewals_.pop_front();
      const bool stopping = stop_;
      mu_.Unlock();
      if (stopping) {
        next.done(absl::CancelledError("PeerLinks is stopping"));
      } else {
        SendRenewal(std::move(next));
      }
      mu_.Lock();
      continue;
    }
    if (releases_.empty()) return;  // stop_ and nothing left to send
    // The first release that is due (retries wait `not_before`; new ones are due at once).
    const absl::Time now = absl::Now();
    auto due = std::find_if(releases_.begin(), releases_.end(),
                            [&](const PendingRelease& r) { return r.not_before <= now; });
    if (due == releases_.end() && !stop_) {
      absl::Time wake = absl::InfiniteFuture();
      for (const PendingRelease& r : releases_) wake = std::min(wake, r.not_before);
      const size_t queued = releases_.size();
      auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !renewals_.empty() || releases_.size() != queued;
      };
      mu_.AwaitWithDeadline(absl::Condition(&more), wake);
      continue;
    }
    if (due == releases_.end()) due = releases_.begin();  // stopping: one last try each
    PendingRelease next = std::move(*due);
    releases_.erase(due);
    const bool stopping = stop_;
    mu_.Unlock();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
    tandem::v1::ReleaseLeaseResponse response;
    grpc::Status s = next.stub->ReleaseLease(&context, next.request, &response);
    const bool retry = !s.ok() && !stopping && next.attempts + 1 < kReleaseAttempts &&
                       (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    if (!s.ok()) {
      LOG(WARNING) << "ReleaseLease " << next.request.lease_id() << " to "
                   << next.request.worker_id() << ": " << s.error_message()
                   << (retry ? " (trying again)" : " (the source frees it at lease expiry)");
    }
    mu_.Lock();
    if (retry) {
      ++next.attempts;
      next.not_before = absl::Now() + absl::Milliseconds(500);
      releases_.push_back(std::move(next));
    }
  }
}

uint64_t PeerLinks::handshakes() const {
  absl::MutexLock lock(&mu_);
  return handshakes_;
}

absl::StatusOr<std::shared_ptr<tandem::v1::KvTransferService::Stub>> PeerLinks::StubFor(
    const tandem::v1::KvHandle& handle) {
  if (handle.transfer_endpoint().empty()) {
    return absl::InvalidArgumentError("KV handle has no transfer endpoint");
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(handle.worker_id());
    if (it != peers_.end() && it->second.endpoint == handle.transfer_endpoint()) {
      return it->second.stub;
    }
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  // A source restarted on its address must be reachable at once. With gRPC's default reconnect
  // backoff (growing towards 2 minutes while the source was down) handshakes failed fast for
  // seconds after it came back; every request in that window recomputed on D and left its lease
  // held on the new source until expiry (tests/reliability fault_test, KillPrefillDuringKvRead).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A source whose link goes silent fails the lease RPCs open on it in ~1-2 s (the worker's
  // server accepts these pings: common/grpc_keepalive.h).
  EnableKeepalive(args);
  auto channel = security::CreateChannel(handle.transfer_endpoint(), security_, args);
  return std::shared_ptr<tandem::v1::KvTransferService::Stub>(
      tandem::v1::KvTransferService::NewStub(channel));
}

namespace {

// With mTLS: the endpoint that answered must hold a KV-source certificate and, when it names its
// worker, be the handle's worker (an address taken over by another daemon cannot serve a handle
// it did not issue). Plain text: nothing to check.
absl::Status CheckSourceIdentity(const grpc::ClientContext& context,
                                 const tandem::v1::KvHandle& handle) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return absl::OkStatus();
  absl::StatusOr<security::PeerIdentity> source = security::PeerIdentityOf(*auth);
  if (!source.ok()) return source.status();
  const bool serves_kv =
      source->role == security::Role::kPrefill || source->role == security::Role::kMixed;
  if (!serves_kv || (!source->worker_id.empty() && source->worker_id != handle.worker_id())) {
    return absl::PermissionDeniedError(absl::StrCat("endpoint ", handle.transfer_endpoint(),
                                                    " presents ", source->ToString(),
                                                    ", not KV source ", handle.worker_id()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PeerLinks::EnsurePeer(const tandem::v1::KvHandle& handle) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(handle.worker_id());
    if (it != peers_.end() && it->second.epoch == handle.epoch() &&
        it->second.endpoint == handle.transfer_endpoint() &&
        (!linked_ || linked_(handle.worker_id()))) {
      return absl::OkStatus();
    }
  }
  absl::MutexLock serialize(&handshake_mu_);
  {  // Someone else may have connected while we waited.
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(handle.worker_id());
    if (it != peers_.end() && it->second.epoch == handle.epoch() &&
        it->second.endpoint == handle.transfer_endpoint() &&
        (!linked_ || linked_(handle.worker_id()))) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<std::shared_ptr<tandem::v1::KvTransferService::Stub>> stub = StubFor(handle);
  if (!stub.ok()) return stub.status();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  context.set_wait_for_ready(true);  // rides out a reconnect (above), bounded by the deadline
  tandem::v1::TransferHandshakeResponse response;
  grpc::Status rpc = (*stub)->Handshake(&context, local_, &response);
  if (!rpc.ok()) {
    return FromGrpcStatus(rpc, absl::StrCat("handshake with ", handle.worker_id(), " at ",
                                            handle.transfer_endpoint()));
  }
  if (absl::Status who = CheckSourceIdentity(context, handle); !who.ok()) return who;
  const tandem::v1::TransferHandshake& peer = response.peer();
  if (!response.accepted()) {
    if (peer.worker_id() == handle.worker_id() && peer.epoch() != handle.epoch()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stale KV handle: source ", handle.worker_id(), " restarted (epoch ",
                       peer.epoch(), ", handle epoch ", handle.epoch(), ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("source ", handle.worker_id(), " refused the handshake: ", response.reason()));
  }
  absl::Status compatible = CheckCompatible(local_, peer);
  if (!compatible.ok()) return compatible;
  if (peer.worker_id() != handle.worker_id()) {
    return absl::FailedPreconditionError(absl::StrCat("endpoint ", handle.transfer_endpoint(),
                                                      " is worker ", peer.worker_id(),
                                                      ", not the handle's ", handle.worker_id()));
  }
  if (peer.epoch() != handle.epoch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale KV handle: source ", handle.worker_id(), " restarted (epoch ",
                     peer.epoch(), ", handle epoch ", handle.epoch(), ")"));
  }
  absl::Status added =
      linker_ ? linker_(handle.worker_id(), peer) : agent_->AddPeer(handle.worker_id(), peer);
  if (!added.ok()) return added;
  absl::MutexLock lock(&mu_);
  peers_[handle.worker_id()] = Peer{peer.epoch(), handle.transfer_endpoint(), *stub};
  ++handshakes_;
  return absl::OkStatus();
}

void PeerLinks::QueueRelease(const std::string& peer, uint64_t epoch, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer);
  // Never linked, or restarted since (the lease died with the old process): nothing to tell.
  if (stop_ || it == peers_.end() || it->second.epoch != epoch) return;
  PendingRelease release;
  release.stub = it->second.stub;
  release.request.set_worker_id(peer);
  release.request.set_epoch(epoch);
  release.request.set_lease_id(lease_id);
  release.request.set_reader_worker_id(local_.worker_id());
  releases_.push_back(std::move(release));
}

void PeerLinks::ReleaseLease(const tandem::v1::KvHandle& handle) {
  absl::StatusOr<std::shared_ptr<tandem::v1::KvTransferService::Stub>> stub = StubFor(handle);
  if (!stub.ok()) return;
  PendingRelease release;
  release.stub = *stub;
  release.request.set_worker_id(handle.worker_id());
  release.request.set_epoch(handle.epoch());
  release.request.set_lease_id(handle.lease_id());
  release.request.set_reader_worker_id(local_.worker_id());
  absl::MutexLock lock(&mu_);
  releases_.push_back(std::move(release));
}

absl::Status PeerLinks::AuthorizeRead(const tandem::v1::KvHandle& handle) {
  absl::StatusOr<std::shared_ptr<tandem::v1::KvTransferService::Stub>> stub = StubFor(handle);
  if (!stub.ok()) return stub.status();
  tandem::v1::AuthorizeReadRequest request;
  *request.mutable_handle() = handle;
  request.set_reader_worker_id(local_.worker_id());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  context.set_wait_for_ready(true);  // rides out a reconnect (StubFor), bounded by the deadline
  tandem::v1::AuthorizeReadResponse response;
  const grpc::Status s = (*stub)->AuthorizeRead(&context, request, &response);
  if (s.ok()) return absl::OkStatus();
  return FromGrpcStatus(s, absl::StrCat("KV source ", handle.worker_id(), " authorizing lease ",
                                        handle.lease_id(), " of request ", handle.request_id()));
}

}  // namespace tandem::kvtransfer
