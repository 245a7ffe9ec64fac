// RequestTable: admission control and cancellation for the requests in flight at the router.
//
// Admission bounds the number of requests in flight (--max_queue): one more is refused with
// RESOURCE_EXHAUSTED before any worker is called. It also owns request ids: a client's id is kept
// when no in-flight request uses it (else ALREADY_EXISTS); an empty id gets a fresh random one.
// The same id is used on the prefill and the decode worker.
//
// Cancellation: each request registers the worker calls it has open (WorkerCall) on its
// InFlightRequest, so Router.Abort, the health thread (a worker missed its heartbeats) and router
// shutdown can interrupt them from other threads. The first cancel reason wins and is what the
// request's handler reports.
//
// Thread safety: everything is thread-safe.
#ifndef TANDEM_ROUTER_REQUEST_TABLE_H_
#define TANDEM_ROUTER_REQUEST_TABLE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/worker_client.h"

namespace tandem::router {

class InFlightRequest {
 public:
  explicit InFlightRequest(std::string id) : id_(std::move(id)) {}

  const std::string& id() const { return id_; }

  // Registers an open call on `worker_id`. Returns false, registering nothing, when the request
  // is already cancelled: the caller must not start the call. `call` must stay valid until
  // RemoveCall(call).
  bool AddCall(const std::string& worker_id, WorkerCall* call);
  void RemoveCall(WorkerCall* call);

  // Records `reason` (the first one wins; must not be OK) and cancels every open call.
  void Cancel(const absl::Status& reason);
  // Cancel(reason) if a call on `worker_id` is open; returns whether it was.
  bool CancelIfUsing(const std::string& worker_id, const absl::Status& reason);
  // OK while not cancelled.
  absl::Status cancel_reason() const;

 private:
  const std::string id_;
  mutable absl::Mutex mu_;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, WorkerCall*>> calls_ ABSL_GUARDED_BY(mu_);
};

class RequestTable;

// An admitted request; releases its slot (and id) when destroyed. Move-only.
class Admission {
 public:
  Admission(RequestTable* table, std::shared_ptr<InFlightRequest> request)
      : table_(table), request_(std::move(request)) {}
  Admission(Admission&& other) noexcept
      : table_(std::exchange(other.table_, nullptr)), request_(std::move(other.request_)) {}
  Admission& operator=(Admission&&) = delete;
  Admission(const Admission&) = delete;
  ~Admission();

  InFlightRequest& request() const { return *request_; }

 private:
  RequestTable* table_;
  std::shared_ptr<InFlightRequest> request_;
};

class RequestTable {
 public:
  // REQUIRES: max_in_flight >= 1.
  explicit RequestTable(int max_in_flight) : max_in_flight_(max_in_flight) {}

  // RESOURCE_EXHAUSTED when full; ALREADY_EXISTS when `requested_id` is in flight.
  absl::StatusOr<Admission> Admit(const std::string& requested_id);

  // Cancels request `id` with `reason`; false when it is not in flight.
  bool Cancel(const std::string& id, const absl::Status& reason);
  // Cancels every request with an open call on `worker_id`; returns how many.
  int CancelUsingWorker(const std::string& worker_id, const absl::Status& reason);
  void CancelAll(const absl::Status& reason);

  size_t size() const;

 private:
  friend class Admission;
  void Release(const std::string& id);
  std::vector<std::shared_ptr<InFlightRequest>> AllRequests() const;

  const int max_in_flight_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<InFlightRequest>> requests_ ABSL_GUARDED_BY(mu_);
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_TABLE_H_
