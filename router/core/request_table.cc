#include "router/core/request_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::router {

bool InFlightRequest::AddCall(const std::string& worker_id, WorkerCall* call) {
  absl::MutexLock lock(&mu_);
  if (!reason_.ok()) return false;
  calls_.emplace_back(worker_id, call);
  return true;
}

void InFlightRequest::RemoveCall(WorkerCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [call](const auto& c) { return c.second == call; }),
               calls_.end());
}

void InFlightRequest::Cancel(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (reason_.ok()) reason_ = reason.ok() ? absl::CancelledError("cancelled") : reason;
  // Cancel is thread-safe and only interrupts the call; the owner still finishes it. The calls
  // stay valid while registered (RemoveCall takes this lock first).
  for (const auto& call : calls_) call.second->Cancel();
}

bool InFlightRequest::CancelIfUsing(const std::string& worker_id, const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (std::none_of(calls_.begin(), calls_.end(),
                     [&](const auto& call) { return call.first == worker_id; })) {
      return false;
    }
  }
  Cancel(reason);
  return true;
}

absl::Status InFlightRequest::cancel_reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

Admission::~Admission() {
  if (table_ != nullptr) table_->Release(*request_);
}

std::string RequestTable::FreshIdLocked() {
  std::string id;
  do {
    id = absl::StrFormat("rtr-%016x", absl::Uniform<uint64_t>(bitgen_));
  } while (worker_ids_.contains(id));
  return id;
}

absl::StatusOr<Admission> RequestTable::Admit(const std::string& requested_id,
                                              const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (requests_.size() >= static_cast<size_t>(max_in_flight_)) {
    return absl::ResourceExhaustedError(absl::StrCat("router is at its limit of ", max_in_flight_,
                                                     " requests in flight; retry later"));
  }
  std::string client_id = requested_id;
  if (client_id.empty()) {
    do {
      client_id = FreshIdLocked();
    } while (requests_.contains(std::make_pair(owner, client_id)));
  } else if (requests_.contains(std::make_pair(owner, client_id))) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", client_id, "' is already in flight"));
  }
  // Another owner's request may use the same id on the workers: give this one a fresh id there.
  std::string worker_id = worker_ids_.contains(client_id) ? FreshIdLocked() : client_id;
  worker_ids_.insert(worker_id);
  auto request = std::make_shared<InFlightRequest>(std::move(worker_id), client_id, owner);
  requests_.emplace(std::make_pair(owner, std::move(client_id)), request);
  return Admission(this, std::move(request));
}

void RequestTable::Release(const InFlightRequest& request) {
  absl::MutexLock lock(&mu_);
  requests_.erase(std::make_pair(request.owner(), request.client_id()));
  worker_ids_.erase(request.id());
}

bool RequestTable::Cancel(const std::string& client_id, const absl::Status& reason,
                          const std::string& owner) {
  std::shared_ptr<InFlightRequest> request;
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(std::make_pair(owner, client_id));
    if (it == requests_.end()) return false;
    request = it->second;
  }
  request->Cancel(reason);
  return true;
}

std::vector<std::shared_ptr<InFlightRequest>> RequestTable::AllRequests() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<InFlightRequest>> all;
  all.reserve(requests_.size());
  for (const auto& [id, request] : requests_) all.push_back(request);
  return all;
}

int RequestTable::CancelUsingWorker(const std::string& worker_id, const absl::Status& reason) {
  int n = 0;
  // Outside the table lock: a request's lock is never taken while holding the table's.
  for (const auto& request : AllRequests()) n += request->CancelIfUsing(worker_id, reason);
  return n;
}

void RequestTable::CancelAll(const absl::Status& reason) {
  for (const auto& request : AllRequests()) request->Cancel(reason);
}

size_t RequestTable::size() const {
  absl::MutexLock lock(&mu_);
  return requests_.size();
}

}  // namespace tandem::router
