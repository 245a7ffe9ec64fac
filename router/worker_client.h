// WorkerClient: the router core's view of one worker's WorkerService, in absl types (the
// pattern of Ray's object_manager_client_interface.h). The gRPC implementation lives in
// grpc_worker_client.h; tests use FakeWorkerClient (fake_worker_client.h), whose replies they
// release one at a time. The registry creates one client per registered worker incarnation
// (WorkerRegistry's ClientFactory) and hands it to calls by shared_ptr, so a client outlives
// every call that holds it, even when its worker re-registers meanwhile.
//
// Calls: New*() prepares a call without starting it, so the caller can register it for
// cancellation first (InFlightRequest::AddCall); Cancel() may come from any thread, before or
// during the call, and makes it end CANCELLED. A call is driven by one thread.
//
// Thread safety: clients are thread-safe; a call object is used by one thread plus Cancel().
#ifndef TANDEM_ROUTER_WORKER_CLIENT_H_
#define TANDEM_ROUTER_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

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
  const CallerContext* caller = nullptr;  // may be null: nothing to inherit
};

class WorkerCall {
 public:
  virtual ~WorkerCall() = default;
  virtual void Cancel() = 0;
};

class PrefillCall : public WorkerCall {
 public:
  // Runs the call (once). Worker errors come back with their code (UNAVAILABLE when the worker
  // is unreachable, DEADLINE_EXCEEDED, CANCELLED, ...).
  virtual absl::StatusOr<v1::PrefillResponse> Run(const v1::PrefillRequest& request) = 0;
};

class StreamCall : public WorkerCall {
 public:
  // The next message; false at the end of the stream (then Finish()). Starts the call at the
  // first Read.
  virtual bool Read(v1::GenerateResponse* message) = 0;
  // The stream's final status; after Read returned false.
  virtual absl::Status Finish() = 0;
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
  // (WorkerService.ReassignLease). Blocks until answered or `deadline`.
  virtual absl::Status ReassignLease(const v1::ReassignLeaseRequest& request,
                                     absl::Time deadline) = 0;
};

// Makes the client for a worker serving at `address` (host:port).
using WorkerClientFactory = std::function<std::shared_ptr<WorkerClient>(const std::string&)>;

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_CLIENT_H_
