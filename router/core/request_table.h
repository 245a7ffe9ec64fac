// RequestTable: admission control and cancellation for the requests in flight at the router.
//
// Admission bounds the number of requests in flight (--max_queue): one more is refused with
// RESOURCE_EXHAUSTED before any worker is called. It also owns request ids, scoped to their
// owner (the caller's API key name or certificate name; "" when anonymous): a client's id is
// kept when none of the same owner's in-flight requests uses it (else ALREADY_EXISTS); an empty
// id gets a fresh random one. Router.Abort finds only the caller's own requests. The id sent to
// the prefill and the decode worker (`id()`, the same on both) is the client's id unless another
// owner's request already uses that id on the workers, then a fresh random one: one client can
// neither collide with nor abort another's request on a worker.
//
// Cancellation: each request registers the worker calls it has open (WorkerCall) on its
// InFlightRequest, so Router.Abort, the health thread (a worker missed its heartbeats) and router
// shutdown can interrupt them from other threads. The first cancel reason wins and is what the
// request's handler reports.
//
// Thread safety: everything is thread-safe.
#ifndef TANDEM_ROUTER_CORE_REQUEST_TABLE_H_
#define TANDEM_ROUTER_CORE_REQUEST_TABLE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/core/worker_client.h"

namespace tandem::router {

class InFlightRequest {
 public:
  explicit InFlightRequest(std::string id) : id_(id), client_id_(std::move(id)) {}
  InFlightRequest(std::string id, std::string client_id, std::string owner)
      : id_(std::move(id)), client_id_(std::move(client_id)), owner_(std::move(owner)) {}

  // The id on the workers (unique among in-flight requests).
  const std::string& id() const { return id_; }
  // The id the client chose or was given (unique among its owner's in-flight requests).
  const std::string& client_id() const { return client_id_; }
  const std::string& owner() const { return owner_; }

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
  const std::string client_id_;
  const std::string owner_;
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
  // The same request, for holders that may outlive this admission (cancel hooks).
  const std::shared_ptr<InFlightRequest>& shared_request() const { return request_; }

 private:
  RequestTable* table_;
  std::shared_ptr<InFlightRequest> request_;
};

class RequestTable {
 public:
  // REQUIRES: max_in_flight >= 1.
  explicit RequestTable(int max_in_flight) : max_in_flight_(max_in_flight) {}

  // RESOURCE_EXHAUSTED when full; ALREADY_EXISTS when `owner` has `requested_id` in flight.
  absl::StatusOr<Admission> Admit(const std::string& requested_id, const std::string& owner = "");

  // Cancels `owner`'s request `client_id` with `reason`; false when it has none in flight.
  bool Cancel(const std::string& client_id, const absl::Status& reason,
              const std::string& owner = "");
  // Cancels every request with an open call on `worker_id`; returns how many.
  int CancelUsingWorker(const std::string& worker_id, const absl::Status& reason);
  void CancelAll(const absl::Status& reason);

  size_t size() const;

 private:
  friend class Admission;
  void Release(const InFlightRequest& request);
  std::vector<std::shared_ptr<InFlightRequest>> AllRequests() const;
  std::string FreshIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_in_flight_;
  mutable absl::Mutex mu_;
  // (owner, client id) -> request.
  absl::flat_hash_map<std::pair<std::string, std::string>, std::shared_ptr<InFlightRequest>>
      requests_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> worker_ids_ ABSL_GUARDED_BY(mu_);
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_REQUEST_TABLE_H_
