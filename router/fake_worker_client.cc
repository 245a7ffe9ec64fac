#include "router/fake_worker_client.h"

#include <utility>

namespace tandem::router {

// Everything the calls and the test share. Calls poll their caller's cancellation while they
// wait (every millisecond), as gRPC's propagation from the server context would cancel them.
struct FakeWorkerClient::State {
  struct Call {
    Kind kind;
    const CallerContext* caller = nullptr;
    v1::GenerateRequest request;
    std::string decode_worker_id;  // kPrefill: PrefillRequest.decode_worker_id
    bool started = false;
    bool seen = false;  // returned by WaitForCall
    bool cancelled = false;
    std::optional<absl::StatusOr<v1::PrefillResponse>> reply;
    std::deque<v1::GenerateResponse> messages;
    std::optional<absl::Status> end;
  };
  mutable absl::Mutex mu;
  std::vector<Call> calls ABSL_GUARDED_BY(mu);
  std::vector<std::string> aborts ABSL_GUARDED_BY(mu);
  std::vector<v1::ReassignLeaseRequest> reassigns ABSL_GUARDED_BY(mu);

  int Add(Kind kind, const CallOptions& options, v1::GenerateRequest request) {
    absl::MutexLock lock(&mu);
    State::Call call;
    call.kind = kind;
    call.caller = options.caller;
    call.request = std::move(request);
    calls.push_back(std::move(call));
    return static_cast<int>(calls.size()) - 1;
  }
  void Cancel(int id) {
    absl::MutexLock lock(&mu);
    calls[id].cancelled = true;
  }
  // Waits until `ready(call)` or the call is cancelled; false when cancelled. Wakes every
  // millisecond to ask the caller whether it went away.
  template <typename Ready>
  bool Wait(int id, Ready ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      const Call& c = calls[id];
      return c.cancelled || ready(c) || (c.caller != nullptr && c.caller->Cancelled());
    };
    while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(1))) {
    }
    Call& call = calls[id];
    if (call.caller != nullptr && call.caller->Cancelled()) call.cancelled = true;
    return !call.cancelled;
  }
};

class FakeWorkerClient::Prefill final : public PrefillCall {
 public:
  Prefill(std::shared_ptr<State> state, int id) : state_(std::move(state)), id_(id) {}
  void Cancel() override { state_->Cancel(id_); }
  absl::StatusOr<v1::PrefillResponse> Run(const v1::PrefillRequest& request) override {
    absl::MutexLock lock(&state_->mu);
    state_->calls[id_].request = request.request();
    state_->calls[id_].decode_worker_id = request.decode_worker_id();
    state_->calls[id_].started = true;
    if (!state_->Wait(id_, [](const State::Call& c) { return c.reply.has_value(); })) {
      return absl::CancelledError("fake prefill cancelled");
    }
    return *state_->calls[id_].reply;
  }

 private:
  const std::shared_ptr<State> state_;
  const int id_;
};

class FakeWorkerClient::Stream final : public StreamCall {
 public:
  Stream(std::shared_ptr<State> state, int id) : state_(std::move(state)), id_(id) {}
  void Cancel() override { state_->Cancel(id_); }
  bool Read(v1::GenerateResponse* message) override {
    absl::MutexLock lock(&state_->mu);
    state_->calls[id_].started = true;
    if (!state_->Wait(
            id_, [](const State::Call& c) { return !c.messages.empty() || c.end.has_value(); })) {
      return false;
    }
    State::Call& call = state_->calls[id_];
    if (call.messages.empty()) return false;  // ended
    *message = std::move(call.messages.front());
    call.messages.pop_front();
    return true;
  }
  absl::Status Finish() override {
    absl::MutexLock lock(&state_->mu);
    state_->calls[id_].started = true;
    if (!state_->Wait(id_, [](const State::Call& c) { return c.end.has_value(); })) {
      return absl::CancelledError("fake stream cancelled");
    }
    return *state_->calls[id_].end;
  }

 private:
  const std::shared_ptr<State> state_;
  const int id_;
};

FakeWorkerClient::FakeWorkerClient() : state_(std::make_shared<State>()) {}
FakeWorkerClient::~FakeWorkerClient() = default;

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

absl::Status FakeWorkerClient::ReassignLease(const v1::ReassignLeaseRequest& request,
                                             absl::Time /*deadline*/) {
  absl::MutexLock lock(&state_->mu);
  state_->reassigns.push_back(request);
  return absl::OkStatus();
}

int FakeWorkerClient::WaitForCall(Kind kind, absl::Duration timeout) {
  absl::MutexLock lock(&state_->mu);
  int found = -1;
  auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    for (size_t i = 0; i < state_->calls.size(); ++i) {
      const State::Call& c = state_->calls[i];
      if (c.kind == kind && c.started && !c.seen) {
        found = static_cast<int>(i);
        return true;
      }
    }
    return false;
  };
  if (!state_->mu.AwaitWithTimeout(absl::Condition(&started), timeout)) return -1;
  state_->calls[found].seen = true;
  return found;
}

v1::GenerateRequest FakeWorkerClient::request(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call].request;
}

std::string FakeWorkerClient::decode_worker_id(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call].decode_worker_id;
}

void FakeWorkerClient::ReplyPrefill(int call, absl::StatusOr<v1::PrefillResponse> reply) {
  absl::MutexLock lock(&state_->mu);
  state_->calls[call].reply = std::move(reply);
}

void FakeWorkerClient::Push(int call, v1::GenerateResponse message) {
  absl::MutexLock lock(&state_->mu);
  state_->calls[call].messages.push_back(std::move(message));
}

void FakeWorkerClient::End(int call, absl::Status status) {
  absl::MutexLock lock(&state_->mu);
  state_->calls[call].end = std::move(status);
}

bool FakeWorkerClient::cancelled(int call) const {
  absl::MutexLock lock(&state_->mu);
  return state_->calls[call].cancelled;
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
