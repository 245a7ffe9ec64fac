// WorkerClient: the router core's view of one worker's WorkerService, in absl types (the
// pattern of Ray's object_manager_client_interface.h). The gRPC implementation lives in
// grpc_worker_client.h; tests use FakeWorkerClient (fake_worker_client.h), whose replies they
// release one at a time. The registry creates one client per registered worker incarnation
// (WorkerRegistry's ClientFactory) and hands it to calls by shared_ptr, so a client outlives
// every call that holds it, even when its worker re-registers meanwhile.
//
// Every call is asynchronous: it starts and returns at once, and its completion callbacks run
// later (gRPC's callback threads; in the fake, the thread that releases the reply). A callback
// may also run inline inside Start() or ReadNext(), so a caller must not hold a lock there that
// its callbacks take; never inside Cancel(), which InFlightRequest calls under its lock.
// Callbacks must not block: the Orchestrator's continue the request on its strand (executor.h),
// on the callback's own thread when the strand is idle.
//
// Calls: New*() prepares a call without starting it, so the caller can register it for
// cancellation first (InFlightRequest::AddCall); Cancel() may come from any thread, before or
// during the call, and makes it end CANCELLED. A call object must outlive its final callback
// (a prefill's `done`, a stream's `on_done`).
//
// Thread safety: clients are thread-safe; a call's Start/ReadNext come from one caller at a time,
// Cancel from any thread.
#ifndef TANDEM_ROUTER_CORE_WORKER_CLIENT_H_
#define TANDEM_ROUTER_CORE_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

// The client request a worker call is made for, as the edge that received it knows it. The
// gRPC edge's implementation also lets the gRPC client tie a worker call's cancellation to its
// client's (grpc_worker_client.h).
class CallerContext {
 public:
  virtual ~CallerContext() = default;
  // True once the client went away (cancelled its call).
  virtual bool Cancelled() const = 0;
  // The client's own deadline (InfiniteFuture when it set none).
  virtual absl::Time deadline() const = 0;
};

struct CallOptions {
  absl::Time deadline = absl::InfiniteFuture();
  // May be null: nothing to inherit. Must outlive the call.
  const CallerContext* caller = nullptr;
};

class WorkerCall {
 public:
  virtual ~WorkerCall() = default;
  virtual void Cancel() = 0;
};

class PrefillCall : public WorkerCall {
 public:
  using DoneCallback = absl::AnyInvocable<void(absl::StatusOr<v1::PrefillResponse>) &&>;
  // Starts the call (once); `done` runs once with the reply or the error (UNAVAILABLE when the
  // worker is unreachable, DEADLINE_EXCEEDED, CANCELLED, ...).
  virtual void Start(const v1::PrefillRequest& request, DoneCallback done) = 0;
};

// A server stream (Decode, Generate), read one message at a time: the next read starts only when
// the reader asks for it, so a slow reader holds back its worker stream, not the router's memory.
class StreamCall : public WorkerCall {
 public:
  using MessageCallback = absl::AnyInvocable<void(v1::GenerateResponse)>;
  using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;
  // Starts the call (once) and its first read. `on_message` runs for each message, one at a
  // time; after each the reader calls ReadNext() exactly once (also after Cancel(): that read
  // ends at once and lets the stream finish). `on_done` runs once, last, with the stream's
  // final status, after the last `on_message` returned and its ReadNext() was made.
  virtual void Start(MessageCallback on_message, DoneCallback on_done) = 0;
  virtual void ReadNext() = 0;
};

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual std::unique_ptr<PrefillCall> NewPrefill(const CallOptions& options) = 0;
  virtual std::unique_ptr<StreamCall> NewDecode(const v1::DecodeRequest& request,
                                                const CallOptions& options) = 0;
  virtual std::unique_ptr<StreamCall> NewGenerate(const v1::GenerateRequest& request,
                                                  const CallOptions& options) = 0;
  // Best effort, returns at once; `done` runs once (any thread) with the call's status. The
  // client stays alive until `done` has run.
  virtual void AbortAsync(const std::string& request_id, absl::Duration timeout,
                          std::function<void(absl::Status)> done) = 0;
  // Prefill worker: rebinds the KV lease it holds for a request to another decode worker
  // (WorkerService.ReassignLease). Returns at once; `done` runs once (any thread) with the
  // answer, by `deadline` at the latest. The client stays alive until `done` has run.
  virtual void ReassignLeaseAsync(const v1::ReassignLeaseRequest& request, absl::Time deadline,
                                  std::function<void(absl::Status)> done) = 0;
  // Whether the connection to the worker is up now (a call would go out at once, not fail for
  // want of one); when it is idle, asks it to connect. Returns at once. A call made while the
  // connection is down after a failure fails at once (UNAVAILABLE) until it is back.
  virtual bool Connected() = 0;
};

// Makes the client for a worker serving at `address` (host:port).
using WorkerClientFactory = std::function<std::shared_ptr<WorkerClient>(const std::string&)>;

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_WORKER_CLIENT_H_
