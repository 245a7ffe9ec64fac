#include "router/testing/fake_worker_client.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace tandem::router {

// Everything the calls, the poller and the test share. Pump(id) delivers what a call has to
// deliver (its reply, next message or end), one callback at a time and outside the lock.
struct FakeWorkerClient::State {
  struct Call {
    Kind kind;
    const CallerContext* caller = nullptr;
    v1::GenerateRequest request;
    std::string decode_worker_id;  // kPrefill: PrefillRequest.decode_worker_id
    bool started = false;
    bool seen = false;  // returned by WaitForCall
    bool cancelled = false;
    bool reading = false;     // a stream's reader waits for a message
    bool delivering = false;  // a callback of this call is running
    bool finished = false;    // its final callback ran (or is running)
    std::optional<absl::StatusOr<v1::PrefillResponse>> reply;
    std::deque<v1::GenerateResponse> messages;
    std::optional<absl::Status> end;
    PrefillCall::DoneCallback prefill_done;
    StreamCall::MessageCallback on_message;
    StreamCall::DoneCallback on_done;
  };
  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<Call>> calls ABSL_GUARDED_BY(mu);  // stable addresses
  std::vector<std::string> aborts ABSL_GUARDED_BY(mu);
  std::vector<v1::ReassignLeaseRequest> reassigns ABSL_GUARDED_BY(mu);
  bool connected ABSL_GUARDED_BY(mu) = true;
  absl::Notification stop;

  int Add(Kind kind, const CallOptions& options, v1::GenerateRequest request) {
    absl::MutexLock lock(&mu);
    auto call = std::make_unique<Call>();
    call->kind = kind;
    call->caller = options.caller;
    call->request = std::move(request);
    calls.push_back(std::move(call));
    return static_cast<int>(calls.size()) - 1;
  }
  Call& Get(int id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return *calls[id]; }

  // What Pump found to deliver.
  struct Delivery {
    PrefillCall::DoneCallback prefill_done;
    absl::StatusOr<v1::PrefillResponse> reply;
    std::optional<v1::GenerateResponse> message;
    StreamCall::DoneCallback on_done;
    absl::Status end;
  };

  // The next thing `c` has to deliver; false when nothing (yet).
  bool Next(Call& c, Delivery& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!c.started || c.finished || c.delivering) return false;
    if (c.caller != nullptr && c.caller->Cancelled()) c.cancelled = true;
    if (c.kind == kPrefill) {
      if (!c.cancelled && !c.reply.has_value()) return false;
      d.prefill_done = std::move(c.prefill_done);
      d.reply = c.cancelled ? absl::CancelledError("fake prefill cancelled") : *c.reply;
      c.finished = true;
      return true;
    }
    if (!c.reading) return false;
    if (!c.cancelled && !c.messages.empty()) {
      d.message = std::move(c.messages.front());
      c.messages.pop_front();
      c.reading = false;
      return true;
    }
    if (!c.cancelled && !c.end.has_value()) return false;
    d.on_done = std::move(c.on_done);
    d.end = c.cancelled ? absl::CancelledError("fake stream cancelled") : *c.end;
    c.finished = true;
    return true;
  }

  void Pump(int id) {
    for (;;) {
      Delivery d;
      Call* c = nullptr;
      {
        absl::MutexLock lock(&mu);
        c = &Get(id);
        if (!Next(*c, d)) return;
        c->delivering = true;
      }
      if (d.prefill_done) {
        std::move(d.prefill_done)(std::move(d.reply));
      } else if (d.message.has_value()) {
        c->on_message(*std::move(d.message));  // only this thread touches it now (delivering)
      } else if (d.on_done) {
        std::move(d.on_done)(d.end);
      }
      absl::MutexLock lock(&mu);
      c->delivering = false;
    }
  }

  // The poller delivers the end.
  void Cancel(int id) {
    absl::MutexLock lock(&mu);
    Get(id).cancelled = true;
  }

  void Update(int id, const std::function<void(Call&)>& change) {
    {
      absl::MutexLock lock(&mu);
      change(Get(id));
    }
    Pump(id);
  }

  // Every millisecond: calls cancelled (Cancel() delivers nothing itself: like gRPC's, it may be
  // called with the caller's locks held) or whose caller went away end CANCELLED.
  void Poll() {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
      std::vector<int> gone;
      {
        absl::MutexLock lock(&mu);
        for (size_t i = 0; i < calls.size(); ++i) {
          const Call& c = *calls[i];
          if (c.started && !c.finished &&
              (c.cancelled || (c.caller != nullptr && c.caller->Cancelled()))) {
            gone.push_back(static_cast<int>(i));
          }
        }
      }
      for (int id : gone) Pump(id);
    }
  }
};

class FakeWorkerClient::Prefill final : public PrefillCall {
 public:
  Prefill(std::shared_ptr<State> state, int id) : state_(std::move(state)), id_(id) {}
  void Cancel() override { state_->Cancel(id_); }
  void Start(const v1::PrefillRequest& request, DoneCallback done) override {
    state_->Update(id_, [&](State::Call& c) {
      c.request = request.request();
      c.decode_worker_id = request.decode_worker_id();
      c.prefill_done = std::move(done);
      c.started = true;
    });
  }

 private:
  const std::shared_ptr<State> state_;
  const int id_;
};

class FakeWorkerClient::Stream final : public StreamCall {
 public:
  Stream(std::shared_ptr<State> state, int id) : state_(std::move(state)), id_(id) {}
  void Cancel() override { state_->Cancel(id_); }
  void Start(MessageCallback on_message, DoneCallback on_done) override {
    state_->Update(id_, [&](State::Call& c) {
      c.on_message = std::move(on_message);
      c.on_done = std::move(on_done);
      c.started = true;
      c.reading = true;
    });
  }
  void ReadNext() override {
    state_->Update(id_, [](State::Call& c) { c.reading = true; });
  }

 private:
  const std::shared_ptr<State> state_;
  const int id_;
};

FakeWorkerClient::FakeWorkerClient() : state_(std::make_shared<State>()) {
  poller_ = std::thread([state = state_.get()] { state->Poll(); });
}

FakeWorkerClient::~FakeWorkerClient() {
  state_->stop.Notify();
  if (poller_.get_id() == std::this_thread::get_id()) {
    poller_.detach();  // the last reference went away in a callback the poller ran
  } else {
    poller_.join();
  }
}

std::unique_ptr<PrefillCall> FakeWorkerClient::NewPrefill(const CallOptions& options) {
  return std::make_unique<Prefill>(state_, state_->Add(kPrefill, options, {}));
}

std::unique_ptr<StreamCall> FakeWorkerClient::NewDecode(const v1::DecodeRequest& request,
                                                        const CallOptions& options) {
  return std::make_unique<Stream>(state_, state_->Add(kDecode, options, request.request()));
}

std::unique_ptr<StreamCall> FakeWorkerClient::NewGenerate(const v1::GenerateRequest& request,
                                                          const CallOptions& options) {
  return std::make_unique<Stream>(state_, state_->Add(kGenerate, options, request));
}

void FakeWorkerClient::AbortAsync(const std::string& request_id, absl::Duration /*timeout*/,
                                  std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->aborts.push_back(request_id);
  }
  if (done) done(absl::OkStatus());
}

void FakeWorkerClient::ReassignLeaseAsync(const v1::ReassignLeaseRequest& request,
                                          absl::Time /*deadline*/,
                                          std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->reassigns.push_back(request);
  }
  if (done) done(absl::OkStatus());
}

bool FakeWorkerClient::Connected() {
  absl::MutexLock lock(&state_->mu);
  return state_->connected;
}

void FakeWorkerClient::SetConnected(bool connected) {
  absl::MutexLock lock(&state_->mu);
  state_->connected = connected;
}

int FakeWorkerClient::WaitForCall(Kind kind, absl::Duration timeout) {
  absl::MutexLock lock(&state_->mu);
  int found = -1;
  auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    for (size_t i = 0; i < state_->calls.size(); ++i) {
      const State::Call& c = *state_->calls[i];
      if (c.kind == kind && c.started && !c.seen) {
        found = static_cast<int>(i);
        return true;
      }
    }
    return false;
  };
  if (!state_->mu.AwaitWithTimeout(absl::Condition(&started), timeout)) return -1;
  state_->Get(found).seen = true;
  return found;
}

v1::GenerateRequest FakeWorkerClient::request(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call]->request;
}

std::string FakeWorkerClient::decode_worker_id(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call]->decode_worker_id;
}

void FakeWorkerClient::ReplyPrefill(int call, absl::StatusOr<v1::PrefillResponse> reply) {
  state_->Update(call, [&](State::Call& c) { c.reply = std::move(reply); });
}

void FakeWorkerClient::Push(int call, v1::GenerateResponse message) {
  state_->Update(call, [&](State::Call& c) { c.messages.push_back(std::move(message)); });
}

void FakeWorkerClient::End(int call, absl::Status status) {
  state_->Update(call, [&](State::Call& c) { c.end = std::move(status); });
}

bool FakeWorkerClient::cancelled(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call]->cancelled;
}

std::vector<std::string> FakeWorkerClient::aborts() const {
  absl::MutexLock lock(&state_->mu);
  return state_->aborts;
}

std::vector<v1::ReassignLeaseRequest> FakeWorkerClient::reassigns() const {
  absl::MutexLock lock(&state_->mu);
  return state_->reassigns;
}

}  // namespace tandem::router
