#include "router/testing/fake_worker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "common/grpc_keepalive.h"
#include "common/security/grpc_security.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

v1::FinishReason FinishOf(uint32_t token, uint32_t count, const v1::GenerateRequest& request,
                          absl::Span<const uint32_t> eos_token_ids) {
  const v1::SamplingParams& sp = request.sampling();
  if (!sp.ignore_eos() &&
      std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end()) {
    return v1::FINISH_REASON_EOS;
  }
  if (std::find(sp.stop_token_ids().begin(), sp.stop_token_ids().end(), token) !=
      sp.stop_token_ids().end()) {
    return v1::FINISH_REASON_STOP_TOKEN;
  }
  if (count >= sp.max_tokens()) return v1::FINISH_REASON_LENGTH;
  return v1::FINISH_REASON_UNSPECIFIED;
}

std::vector<uint64_t> PromptChain(const v1::GenerateRequest& request, uint32_t block_size) {
  std::vector<int32_t> tokens(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  std::vector<uint64_t> chain;
  for (const BlockHash& h : ComputeBlockHashes(tokens, block_size, request.cache_salt())) {
    chain.push_back(h.Short());
  }
  return chain;
}

}  // namespace

uint32_t FakeNextToken(uint32_t prev, uint32_t vocab_size) {
  return static_cast<uint32_t>((31 * uint64_t{prev} + 7) % vocab_size);
}

uint32_t FakeSampledVocab(const v1::GenerateRequest& request, uint32_t vocab_size) {
  const uint32_t limit = request.sampling().vocab_limit();
  return limit > 0 && limit < vocab_size ? limit : vocab_size;
}

FakeCompletion FakeGenerate(const v1::GenerateRequest& request, uint32_t vocab_size,
                            absl::Span<const uint32_t> eos_token_ids) {
  vocab_size = FakeSampledVocab(request, vocab_size);
  FakeCompletion out;
  const auto& prompt = request.prompt_token_ids();
  uint32_t prev = prompt.empty() ? 0 : prompt[prompt.size() - 1];
  while (out.finish_reason == v1::FINISH_REASON_UNSPECIFIED) {
    prev = FakeNextToken(prev, vocab_size);
    out.tokens.push_back(prev);
    out.finish_reason =
        FinishOf(prev, static_cast<uint32_t>(out.tokens.size()), request, eos_token_ids);
  }
  return out;
}

namespace {

// A stream refused before its first message: only its status.
class RefusedStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RefusedStream(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// A Decode/Generate stream: one token per `token_delay`, one write in flight. Each step (a tick
// on the worker's executor, or gRPC's OnWriteDone) starts exactly the next one, so one runs at a
// time and none is pending when the stream finishes; a wait is cut in 5 ms slices, each checking
// for a cancel, an Abort or Kill() (as Pause does for Prefill).
class FakeWorker::StreamReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // Streams tokens after `prev` (`count` already generated), one per message.
  StreamReactor(FakeWorker* w, grpc::CallbackServerContext* ctx, v1::GenerateRequest request,
                uint32_t prev, uint32_t count)
      : w_(w), ctx_(ctx), request_(std::move(request)), prev_(prev), count_(count) {
    {
      absl::MutexLock lock(&w_->mu_);
      w_->active_[request_.request_id()] = false;
      ++w_->open_streams_;
    }
    due_ = absl::Now() + w_->options_.token_delay;
    w_->executor_.Post([this] { Tick(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    } else if (finished_) {
      Finish(grpc::Status::OK);
    } else {
      due_ = absl::Now() + w_->options_.token_delay;
      Tick();
    }
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&w_->mu_);
      --w_->open_streams_;
      w_->active_.erase(request_.request_id());
    }
    delete this;
  }

 private:
  void Tick() {
    if (ctx_->IsCancelled() || w_->Stopped(request_.request_id())) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled or aborted"));
      return;
    }
    const absl::Time now = absl::Now();
    if (now < due_) {
      w_->executor_.PostAt(std::min(due_, now + absl::Milliseconds(5)), [this] { Tick(); });
      return;
    }
    const FakeWorkerOptions& o = w_->options_;
    prev_ = FakeNextToken(prev_, w_->SampledVocab(request_));
    ++count_;
    chunk_.Clear();
    chunk_.set_request_id(request_.request_id());
    chunk_.add_token_ids(prev_);
    const v1::FinishReason finish = FinishOf(prev_, count_, request_, o.eos_token_ids);
    if (finish != v1::FINISH_REASON_UNSPECIFIED) {
      finished_ = true;
      chunk_.set_finish_reason(finish);
      chunk_.mutable_usage()->set_prompt_tokens(request_.prompt_token_ids_size());
      chunk_.mutable_usage()->set_completion_tokens(count_);
    }
    StartWrite(&chunk_);
  }

  FakeWorker* const w_;
  grpc::CallbackServerContext* const ctx_;
  const v1::GenerateRequest request_;
  uint32_t prev_, count_;
  absl::Time due_;
  bool finished_ = false;
  v1::GenerateResponse chunk_;  // the write in flight
};

class FakeWorker::Service final
    : public v1::WorkerService::WithCallbackMethod_Decode<
          v1::WorkerService::WithCallbackMethod_Generate<v1::WorkerService::Service>> {
 public:
  // Marks a request as running on this worker for its scope, so Abort can stop it.
  class ActiveCall {
   public:
    ActiveCall(FakeWorker* w, std::string id) : w_(w), id_(std::move(id)) {
      absl::MutexLock lock(&w_->mu_);
      w_->active_[id_] = false;
    }
    ~ActiveCall() {
      absl::MutexLock lock(&w_->mu_);
      w_->active_.erase(id_);
    }

   private:
    FakeWorker* w_;
    std::string id_;
  };

  explicit Service(FakeWorker* w) : w_(w) {}

  grpc::Status Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override {
    const FakeWorkerOptions& o = w_->options_;
    const v1::GenerateRequest& r = req->request();
    {
      absl::MutexLock lock(&w_->mu_);
      ++w_->counters_.prefill;
    }
    if (o.role == v1::WORKER_ROLE_DECODE) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "decode worker: no Prefill");
    }
    if (r.prompt_token_ids().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty prompt");
    }
    ActiveCall active(w_, r.request_id());
    if (!w_->Pause(ctx, r.request_id(), o.prefill_delay)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled");
    }
    const std::vector<uint64_t> chain = PromptChain(r, o.block_size);
    uint32_t cached_blocks = 0;
    uint64_t lease_id = 0;
    {
      absl::MutexLock lock(&w_->mu_);
      while (cached_blocks < chain.size() && w_->cached_.contains(chain[cached_blocks])) {
        ++cached_blocks;
      }
      for (uint64_t h : chain) {
        if (w_->cached_.insert(h).second) w_->pending_added_.push_back(h);
      }
      lease_id = w_->next_lease_id_++;
    }
    const uint32_t first =
        FakeNextToken(r.prompt_token_ids(r.prompt_token_ids_size() - 1), w_->SampledVocab(r));
    resp->set_request_id(r.request_id());
    resp->set_first_token(first);
    resp->set_finish_reason(FinishOf(first, 1, r, o.eos_token_ids));
    v1::Usage* usage = resp->mutable_usage();
    usage->set_prompt_tokens(r.prompt_token_ids_size());
    usage->set_completion_tokens(1);
    usage->set_cached_prompt_tokens(cached_blocks * o.block_size);
    if (resp->finish_reason() != v1::FINISH_REASON_UNSPECIFIED || !req->remote_decode()) {
      return grpc::Status::OK;
    }
    v1::KvHandle* h = resp->mutable_kv_handle();
    h->set_worker_id(o.worker_id);
    h->set_epoch(o.epoch);
    const uint32_t num_blocks = (r.prompt_token_ids_size() + o.block_size - 1) / o.block_size;
    for (uint32_t b = 0; b < num_blocks; ++b) h->add_block_ids(b);
    h->set_num_tokens(r.prompt_token_ids_size());
    h->set_layout_hash(o.kv_layout_hash);
    h->set_lease_id(lease_id);
    h->set_lease_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(30)));
    h->set_transfer_endpoint(w_->address_);
    return grpc::Status::OK;
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Decode(grpc::CallbackServerContext* ctx,
                                                         const v1::DecodeRequest* req) override {
    const FakeWorkerOptions& o = w_->options_;
    const v1::GenerateRequest& r = req->request();
    {
      absl::MutexLock lock(&w_->mu_);
      ++w_->counters_.decode;
    }
    if (o.role == v1::WORKER_ROLE_PREFILL) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "prefill worker: no Decode"));
    }
    // The router must hand over P's handle untouched.
    const v1::KvHandle& h = req->kv_handle();
    if (h.num_tokens() != static_cast<uint64_t>(r.prompt_token_ids_size()) ||
        h.layout_hash() != o.kv_layout_hash || h.worker_id().empty()) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("kv_handle does not match the request: ", h.num_tokens(),
                                    " tokens from '", h.worker_id(), "'")));
    }
    if (FinishOf(req->first_token(), 1, r, o.eos_token_ids) != v1::FINISH_REASON_UNSPECIFIED) {
      return new RefusedStream(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                            "the request already finished at its first token"));
    }
    return new StreamReactor(w_, ctx, r, req->first_token(), /*count=*/1);
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* r) override {
    const FakeWorkerOptions& o = w_->options_;
    {
      absl::MutexLock lock(&w_->mu_);
      ++w_->counters_.generate;
    }
    if (o.role != v1::WORKER_ROLE_MIXED) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not a mixed worker"));
    }
    if (r->prompt_token_ids().empty()) {
      return new RefusedStream(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty prompt"));
    }
    return new StreamReactor(w_, ctx, *r, r->prompt_token_ids(r->prompt_token_ids_size() - 1),
                             /*count=*/0);
  }

  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest* req,
                     v1::AbortResponse* resp) override {
    absl::SleepFor(w_->options_.abort_reply_delay);
    absl::MutexLock lock(&w_->mu_);
    ++w_->counters_.abort;
    w_->aborted_.insert(req->request_id());
    auto it = w_->active_.find(req->request_id());
    resp->set_found(it != w_->active_.end());
    if (it != w_->active_.end()) it->second = true;
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const v1::WorkerHealthRequest*,
                      v1::HealthResponse* resp) override {
    absl::MutexLock lock(&w_->mu_);
    resp->set_status(w_->status_);
    resp->set_detail("fake worker");
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext*, const v1::WorkerStatsRequest*,
                     v1::WorkerStats* resp) override {
    *resp->mutable_info() = w_->Info();
    absl::MutexLock lock(&w_->mu_);
    resp->set_status(w_->status_);
    *resp->mutable_load() = w_->load_;
    return grpc::Status::OK;
  }

 private:
  FakeWorker* w_;
};

FakeWorker::FakeWorker(FakeWorkerOptions options)
    : options_(std::move(options)), service_(std::make_unique<Service>(this)) {
  load_.set_kv_blocks_total(options_.kv_blocks_total);
  load_.set_kv_blocks_free(options_.kv_blocks_total);
}

absl::StatusOr<std::unique_ptr<FakeWorker>> FakeWorker::Start(FakeWorkerOptions options) {
  if (options.vocab_size < 1 || options.block_size < 1) {
    return absl::InvalidArgumentError("fake worker: vocab_size and block_size must be >= 1");
  }
  std::unique_ptr<FakeWorker> w(new FakeWorker(std::move(options)));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(w->options_.listen,
                           security::InternalServerCredentials(w->options_.security), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(v1::kMaxGrpcMessageBytes));
  AllowKeepalivePings(builder);  // the router's channels ping every second
  builder.RegisterService(w->service_.get());
  w->server_ = builder.BuildAndStart();
  if (w->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("fake worker: cannot listen on ", w->options_.listen));
  }
  const std::string& listen = w->options_.listen;
  w->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  if (!w->options_.router_address.empty()) {
    w->heartbeat_thread_ = std::thread([p = w.get()] { p->HeartbeatLoop(); });
  }
  return w;
}

FakeWorker::~FakeWorker() { Kill(); }

void FakeWorker::Kill() {
  if (killed_.exchange(true)) return;
  stop_.Notify();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // A deadline in the past cancels every open call at once; then waits for the handlers.
  server_->Shutdown(std::chrono::system_clock::now());
}

uint32_t FakeWorker::SampledVocab(const v1::GenerateRequest& request) const {
  if (options_.ignore_vocab_limit) return options_.vocab_size;
  return FakeSampledVocab(request, options_.vocab_size);
}

v1::WorkerInfo FakeWorker::Info() const {
  v1::WorkerInfo info;
  info.set_worker_id(options_.worker_id);
  info.set_address(address_);
  info.set_role(options_.role);
  info.set_epoch(options_.epoch);
  info.set_model_id(options_.model_id);
  info.set_vocab_size(options_.vocab_size);
  info.set_max_model_len(options_.max_model_len);
  info.set_block_size(options_.block_size);
  info.set_kv_layout_hash(options_.kv_layout_hash);
  for (uint32_t t : options_.eos_token_ids) info.add_eos_token_ids(t);
  return info;
}

bool FakeWorker::Stopped(const std::string& request_id) const {
  if (killed_.load()) return true;
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  return it != active_.end() && it->second;
}

bool FakeWorker::Pause(grpc::ServerContext* ctx, const std::string& request_id,
                       absl::Duration d) const {
  const absl::Time until = absl::Now() + d;
  while (true) {
    if (ctx->IsCancelled() || Stopped(request_id)) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(5)));
  }
}

std::optional<absl::Duration> FakeWorker::Register(v1::WorkerRegistry::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::RegisterWorkerRequest req;
  *req.mutable_info() = Info();
  v1::RegisterWorkerResponse resp;
  if (!stub.RegisterWorker(&ctx, req, &resp).ok()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  registered_ = true;
  // A fresh registration has an empty index on the router: report the whole cache again.
  pending_added_.assign(cached_.begin(), cached_.end());
  return absl::Milliseconds(resp.heartbeat_interval_ms());
}

bool FakeWorker::SendHeartbeat(v1::WorkerRegistry::Stub& stub) {
  v1::HeartbeatRequest req;
  size_t num_added = 0;
  {
    absl::MutexLock lock(&mu_);
    req.set_worker_id(options_.worker_id);
    req.set_epoch(options_.epoch);
    req.set_status(status_);
    *req.mutable_load() = load_;
    num_added = std::min<size_t>(pending_added_.size(), v1::kMaxHeartbeatBlockHashes);
    for (size_t i = 0; i < num_added; ++i) req.add_added_block_hashes(pending_added_[i]);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::HeartbeatResponse resp;
  if (!stub.Heartbeat(&ctx, req, &resp).ok()) return false;
  absl::MutexLock lock(&mu_);
  if (!resp.known()) {
    registered_ = false;
    return false;
  }
  pending_added_.erase(pending_added_.begin(), pending_added_.begin() + num_added);
  ++heartbeats_acked_;
  return true;
}

void FakeWorker::HeartbeatLoop() {
  auto stub = v1::WorkerRegistry::NewStub(
      security::CreateChannel(options_.router_address, options_.security));
  absl::Duration interval = options_.heartbeat_interval > absl::ZeroDuration()
                                ? options_.heartbeat_interval
                                : absl::Seconds(1);
  while (!stop_.HasBeenNotified()) {
    bool registered = false;
    bool paused = false;
    {
      absl::MutexLock lock(&mu_);
      registered = registered_;
      paused = paused_;
    }
    absl::Duration wait = interval;
    if (!registered) {
      if (std::optional<absl::Duration> told = Register(*stub); told.has_value()) {
        // The router's interval unless overridden; asked again on every registration because
        // the router may have restarted with another one.
        if (options_.heartbeat_interval == absl::ZeroDuration()) {
          interval = std::max(*told, absl::Milliseconds(10));
        }
        continue;  // heartbeat right away
      }
      wait = absl::Milliseconds(100);  // the router is not up yet
    } else if (!paused) {
      SendHeartbeat(*stub);
    }
    stop_.WaitForNotificationWithTimeout(wait);
  }
}

void FakeWorker::SetLoad(const v1::WorkerLoad& load) {
  absl::MutexLock lock(&mu_);
  load_ = load;
}

void FakeWorker::SetStatus(v1::ServingStatus status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
}

void FakeWorker::AddCachedBlocks(absl::Span<const uint64_t> hashes) {
  absl::MutexLock lock(&mu_);
  for (uint64_t h : hashes) {
    if (cached_.insert(h).second) pending_added_.push_back(h);
  }
}

void FakeWorker::SetHeartbeatsPaused(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

bool FakeWorker::WaitForHeartbeats(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const int64_t target = heartbeats_acked_ + n;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_acked_ >= target; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

bool FakeWorker::WaitRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registered_; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

FakeWorker::Counters FakeWorker::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

int FakeWorker::total_calls() const {
  absl::MutexLock lock(&mu_);
  return counters_.prefill + counters_.decode + counters_.generate;
}

bool FakeWorker::WasAborted(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  return aborted_.contains(request_id);
}

bool FakeWorker::WaitForAbort(const std::string& request_id, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_.contains(request_id); };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

int FakeWorker::open_streams() const {
  absl::MutexLock lock(&mu_);
  return open_streams_;
}

}  // namespace tandem::router
