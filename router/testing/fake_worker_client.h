// FakeWorkerClient: a WorkerClient (worker_client.h) whose calls complete only when the test
// answers them, one at a time, so orchestration can be tested at every interleaving without a
// network (the pattern of Ray's fake_object_manager_client.h). Like the gRPC client, a call ends
// CANCELLED as soon as it is cancelled or its caller (CallOptions::caller) goes away (a thread of
// the fake polls the callers every millisecond), and a cancel wins over a reply released
// afterwards. Completion callbacks run on the thread that releases a reply, ends a call or asks
// for the next message (inline inside the caller's Start/ReadNext when the answer is already
// there), or on the polling thread, which also delivers every cancel (never inside Cancel()).
//
//   auto p = std::make_shared<FakeWorkerClient>();
//   ... the orchestrator starts p->NewPrefill(...) ...
//   int call = p->WaitForCall(FakeWorkerClient::kPrefill);
//   p->ReplyPrefill(call, response);            // or an error status
//   int stream = d->WaitForCall(FakeWorkerClient::kDecode);
//   d->Push(stream, message); d->End(stream, absl::OkStatus());
//
// Thread safety: thread-safe.
#ifndef TANDEM_ROUTER_TESTING_FAKE_WORKER_CLIENT_H_
#define TANDEM_ROUTER_TESTING_FAKE_WORKER_CLIENT_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "router/core/worker_client.h"

namespace tandem::router {

class FakeWorkerClient final : public WorkerClient {
 public:
  enum Kind { kPrefill, kDecode, kGenerate };

  FakeWorkerClient();
  ~FakeWorkerClient() override;

  std::unique_ptr<PrefillCall> NewPrefill(const CallOptions& options) override;
  std::unique_ptr<StreamCall> NewDecode(const v1::DecodeRequest& request,
                                        const CallOptions& options) override;
  std::unique_ptr<StreamCall> NewGenerate(const v1::GenerateRequest& request,
                                          const CallOptions& options) override;
  // Recorded and answered OK at once.
  void AbortAsync(const std::string& request_id, absl::Duration timeout,
                  std::function<void(absl::Status)> done) override;
  // Recorded and answered OK at once.
  void ReassignLeaseAsync(const v1::ReassignLeaseRequest& request, absl::Time deadline,
                          std::function<void(absl::Status)> done) override;
  // What SetConnected set (true at first).
  bool Connected() override;
  void SetConnected(bool connected);

  // Waits up to `timeout` for a call of `kind` that started (Start) and has not been
  // returned by an earlier WaitForCall; its handle, or -1.
  int WaitForCall(Kind kind, absl::Duration timeout = absl::Seconds(10));
  // The request a call was made with (PrefillRequest's request for kPrefill).
  v1::GenerateRequest request(int call) const;
  // kPrefill: the decode worker the router bound the lease to.
  std::string decode_worker_id(int call) const;
  void ReplyPrefill(int call, absl::StatusOr<v1::PrefillResponse> reply);
  void Push(int call, v1::GenerateResponse message);
  void End(int call, absl::Status status);
  // Whether the call ended cancelled (Cancel() or its caller went away).
  bool cancelled(int call) const;
  std::vector<std::string> aborts() const;
  std::vector<v1::ReassignLeaseRequest> reassigns() const;

 private:
  struct State;
  class Prefill;
  class Stream;
  std::shared_ptr<State> state_;
  std::thread poller_;  // cancels the calls whose caller went away
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TESTING_FAKE_WORKER_CLIENT_H_
