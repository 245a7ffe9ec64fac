// UcxAgent, part 2: the transfer / endpoint state machines, UCX callbacks and the progress
// thread (part 1, ucx_agent.cc: setup and the TransferAgent methods). Everything here runs with
// mu_ held, except ProgressLoop's sleeping.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/ucx_status.h"
#include "glog/logging.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/streaming_copy.h"
#include "kvtransfer/ucx/ucx_agent_impl.h"

// Converted UCX error naming the call and the line it failed at.
#define UCX_ERROR(status, call) ::tandem::UcxStatus((status), {(call), __FILE__, __LINE__})

namespace tandem::kvtransfer {
namespace {

// A draining endpoint whose requests do not complete within this time is force-closed anyway
// (which completes them as cancelled), so a misbehaving transport cannot hang a transfer.
constexpr absl::Duration kDrainForceAfter = absl::Seconds(3);
constexpr absl::Duration kCancelForceAfter = absl::Seconds(1);

}  // namespace

// ---------------------------------------------------------------------------------------------
// Transfer state machine (all under mu_).

void UcxAgentImpl::StopTransferLocked(Transfer& t, const absl::Status& reason) {
  if (t.ended) return;
  if (t.error.ok()) t.error = reason;
  t.cancelled_at = std::min(t.cancelled_at, absl::Now());
  // ucp_request_cancel may complete a request (and run OnGetDone) right here: iterate a copy.
  std::vector<void*> requests;
  for (const auto& [request, bytes] : t.requests) requests.push_back(request);
  for (void* request : requests) ucp_request_cancel(worker_, request);
  // Queued direct copies of `t` never run: the transfer ends as soon as the copies already
  // running (and cancelled UCX requests) are done.
  std::vector<DirectCopy> dropped;
  for (auto it = copy_queue_.begin(); it != copy_queue_.end();) {
    if (it->transfer == &t) {
      dropped.push_back(*it);
      it = copy_queue_.erase(it);
    } else {
      ++it;
    }
  }
  for (const DirectCopy& copy : dropped) FinishDirectCopyLocked(copy);
  AbandonGathersLocked(t);
  MaybeEndLocked(t);
}

void UcxAgentImpl::MaybeEndLocked(Transfer& t) {
  if (t.ended || t.inflight > 0) return;
  const bool all_posted = t.next_op == t.ops.size();
  if (t.error.ok() && !all_posted) return;
  transfers_.End(t, t.error, t.total_bytes, &stats_);
}

void UcxAgentImpl::StopConnLocked(Conn* conn, const absl::Status& reason) {
  transfers_.ForEach([&](Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (t.conn == conn) StopTransferLocked(t, reason);
  });
  if (conn->state == Conn::State::kActive) {
    conn->state = Conn::State::kDraining;
    conn->draining_since = absl::Now();
  }
}

void UcxAgentImpl::OnGetDone(void* request, ucs_status_t status, void* user_data) {
  Transfer* t = static_cast<Transfer*>(user_data);
  UcxAgentImpl* agent = t->conn->agent;
  agent->mu_.AssertHeld();  // callbacks run inside UCX calls we make under mu_
  auto it = t->requests.find(request);
  const uint64_t bytes = it == t->requests.end() ? 0 : it->second;
  if (it != t->requests.end()) t->requests.erase(it);
  agent->OnRequestDone(*t, request, bytes, status);
}

void UcxAgentImpl::OnRequestDone(Transfer& t, void* request, uint64_t bytes, ucs_status_t status) {
  if (request != nullptr) ucp_request_free(request);
  absl::Status result = absl::OkStatus();
  if (status != UCS_OK) {
    result = status == UCS_ERR_CANCELED && t.cancel_requested
                 ? absl::CancelledError(absl::StrCat("transfer ", t.id, " cancelled"))
                 : UCX_ERROR(status, "ucp_get_nbx completion");
  }
  EndRequestLocked(t, bytes, result);
}

void UcxAgentImpl::CountPostedLocked(Transfer& t, uint64_t bytes) {
  ++t.inflight;
  t.inflight_bytes += bytes;
  ++t.conn->inflight;
  ++inflight_requests_;
  inflight_bytes_ += bytes;
}

void UcxAgentImpl::EndRequestLocked(Transfer& t, uint64_t bytes, const absl::Status& status) {
  --t.inflight;
  --t.conn->inflight;
  --inflight_requests_;
  t.inflight_bytes -= bytes;
  inflight_bytes_ -= bytes;
  if (!status.ok()) StopTransferLocked(t, status);
  MaybeEndLocked(t);
}

void UcxAgentImpl::OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  Conn* conn = static_cast<Conn*>(arg);
  UcxAgentImpl* agent = conn->agent;
  agent->mu_.AssertHeld();
  if (conn->failure.ok()) {
    conn->failure = absl::UnavailableError(
        absl::StrCat("UCX endpoint to peer ", conn->name, " failed: ", ucs_status_string(status)));
  }
  agent->StopConnLocked(conn, conn->failure);
}

// ---------------------------------------------------------------------------------------------
// Progress thread.

UcxAgentImpl::Transfer* UcxAgentImpl::NextTransferToPostLocked() {
  while (!post_queue_.empty()) {
    Transfer* t = transfers_.Find(post_queue_.front());
    if (t == nullptr || t->ended || !t->error.ok() || t->next_op == t->ops.size()) {
      post_queue_.pop_front();  // nothing (more) to post
      continue;
    }
    Conn* conn = t->conn;
    if (conn->state != Conn::State::kActive) {
      post_queue_.pop_front();
      StopTransferLocked(
          *t, conn->failure.ok() ? absl::CancelledError("peer connection closed") : conn->failure);
      continue;
    }
    return t;
  }
  return nullptr;
}

UcxAgentImpl::ReadRequest UcxAgentImpl::NextRequest(const Transfer& t, uint64_t limit) {
  const StridedCopyOp& op = t.ops[t.next_op];
  ReadRequest req{.op = &op, .strided = op.rows > 1, .first_row = t.next_offset};
  // A request: one row's next bytes, or whole rows of a strided op (a row always fits one:
  // PostStridedRead checks it).
  if (req.strided) {
    req.rows = std::min(op.rows - t.next_offset, std::max<uint64_t>(1, limit / op.row_bytes));
    req.bytes = req.rows * op.row_bytes;
    req.local_offset = op.local_offset + t.next_offset * op.local_stride;
    req.remote_offset = op.remote_offset + t.next_offset * op.remote_stride;
    // The bytes this request reads from the peer's region: first row to last row's end.
    req.remote_span = (req.rows - 1) * op.remote_stride + op.row_bytes;
  } else {
    req.bytes = std::min(limit, op.row_bytes - t.next_offset);
    req.local_offset = op.local_offset + t.next_offset;
    req.remote_offset = op.remote_offset + t.next_offset;
    req.remote_span = req.bytes;
  }
  return req;
}

void UcxAgentImpl::AdvancePastRequestLocked(Transfer& t, const ReadRequest& req) {
  t.next_offset += req.strided ? req.rows : req.bytes;
  if (t.next_offset == (req.strided ? req.op->rows : req.op->row_bytes)) {
    ++t.next_op;
    t.next_offset = 0;
  }
  // Round robin between transfers sharing the in-flight window.
  const TransferId id = post_queue_.front();
  post_queue_.pop_front();
  if (t.next_op < t.ops.size()) post_queue_.push_back(id);
}

UcxAgentImpl::Posted UcxAgentImpl::PostOneLocked() {
  Transfer* t = NextTransferToPostLocked();
  if (t == nullptr) return Posted::kNothing;
  const LocalRegion& local = regions_[t->ops[t->next_op].local_region];
  uint64_t limit = options_.max_request_bytes;
  // A READ into staged device memory goes through a free staging buffer (or waits for one).
  StagingSlot* slot = nullptr;
  if (local.device != nullptr) {
    limit = std::min(limit, options_.cuda_staging_bytes);
    slot = FreeStagingSlotLocked();
    if (slot == nullptr) return Posted::kNothing;
  }
  ReadRequest req = NextRequest(*t, limit);
  if (inflight_bytes_ > 0 && inflight_bytes_ + req.bytes > options_.max_inflight_bytes) {
    return Posted::kNothing;
  }
  req.slot = slot;
  req.dest = slot != nullptr ? slot->host : local.base + req.local_offset;
  if (slot != nullptr) {
    slot->state = StagingSlot::State::kFilling;
    slot->transfer = t;
    slot->device_dst = local.device + req.local_offset;
    slot->source = nullptr;
    slot->bytes = req.bytes;
    slot->rows = req.rows;
    slot->row_bytes = req.strided ? req.op->row_bytes : req.bytes;
    slot->device_stride = req.op->local_stride;
    slot->source_stride = req.op->remote_stride;
  }
  AdvancePastRequestLocked(*t, req);
  return IssueRequestLocked(*t, req);
}

UcxAgentImpl::Posted UcxAgentImpl::IssueRequestLocked(Transfer& t, const ReadRequest& req) {
  RemoteRegion& remote = t.conn->regions[req.op->remote_region];
  StagingSlot* slot = req.slot;
  const uint64_t n = req.bytes;
  if (remote.populated != nullptr) {  // best effort: a copy still faults pages in itself
    remote.populated->PinCovering(req.remote_offset, req.remote_span).status().IgnoreError();
  }
  if (slot != nullptr && DmaFromMappedLocked(remote, req.remote_offset, req.remote_span)) {
    // the GPU copies from the mapping
    CountPostedLocked(t, n);
    slot->source = remote.mapped + req.remote_offset;
    StartToDeviceLocked(*slot);
    return Posted::kRequest;
  }
  if (options_.direct_copy && remote.mapped != nullptr) {
    CountPostedLocked(t, n);
    const size_t streaming = t.total_bytes >= options_.min_streaming_transfer_bytes
                                 ? kDefaultMinStreamingBytes
                                 : SIZE_MAX;
    DirectCopy copy{&t, req.dest, remote.mapped + req.remote_offset, n, slot, streaming};
    if (req.strided) {
      copy.rows = req.rows;
      copy.row_bytes = req.op->row_bytes;
      // Into a staging buffer the rows land packed; the device copy spreads them.
      copy.dst_stride = slot != nullptr ? req.op->row_bytes : req.op->local_stride;
      copy.src_stride = req.op->remote_stride;
    }
    copy_queue_.push_back(copy);
    ++direct_copies_;
    return Posted::kDirectCopy;
  }
  if (req.strided && t.conn->gather) {  // no strided GET: the source packs the rows
    PostGatherLocked(t, *req.op, req.first_row, req.rows, slot);
    return Posted::kRequest;
  }
  if (req.strided) {  // PostStridedRead admits only mapped or gathering peers
    if (slot != nullptr) slot->state = StagingSlot::State::kFree;
    StopTransferLocked(t, absl::UnavailableError("strided read from an unmapped region"));
    return Posted::kRequest;
  }
  PostGetLocked(t, req, remote);
  return Posted::kRequest;
}

void UcxAgentImpl::PostGetLocked(Transfer& t, const ReadRequest& req, RemoteRegion& remote) {
  StagingSlot* slot = req.slot;
  const uint64_t n = req.bytes;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  param.cb.send = slot != nullptr ? &UcxAgentImpl::OnStagedGetDone : &UcxAgentImpl::OnGetDone;
  param.user_data = slot != nullptr ? static_cast<void*>(slot) : static_cast<void*>(&t);
  param.memh = slot != nullptr ? slot->memh : regions_[req.op->local_region].memh;
  ucs_status_ptr_t request =
      ucp_get_nbx(remote.ep, req.dest, n, remote.base + req.remote_offset, remote.rkey, &param);
  if (UCS_PTR_IS_ERR(request)) {
    if (slot != nullptr) slot->state = StagingSlot::State::kFree;
    StopTransferLocked(t, UCX_ERROR(UCS_PTR_STATUS(request), "ucp_get_nbx"));
    return;
  }
  CountPostedLocked(t, n);
  if (request != nullptr) {
    t.requests[request] = n;
  } else if (slot != nullptr) {  // completed in place: the staging buffer is full
    StartToDeviceLocked(*slot);
  } else {  // completed in place (shared memory GETs usually do)
    EndRequestLocked(t, n, absl::OkStatus());
  }
}

void UcxAgentImpl::RunQueuedCopyLocked() {
  const DirectCopy copy = copy_queue_.front();
  copy_queue_.pop_front();
  // Unlocked: the copy is counted as outstanding, which keeps its transfer, endpoint and rkey
  // (the mapping of the peer's segment) alive until FinishDirectCopyLocked. A transfer stopped
  // meanwhile still gets this one copy (bounded by max_request_bytes) before it can end.
  mu_.Unlock();
  if (copy.rows > 1) {
    StridedStreamingCopy(copy.dst, copy.dst_stride, copy.src, copy.src_stride, copy.row_bytes,
                         copy.rows, copy.min_streaming_bytes);
  } else {
    StreamingCopy(copy.dst, copy.src, copy.bytes, copy.min_streaming_bytes);
  }
  mu_.Lock();
  FinishDirectCopyLocked(copy);
}

void UcxAgentImpl::FinishDirectCopyLocked(const DirectCopy& copy) {
  --direct_copies_;
  if (copy.slot != nullptr) {
    StartToDeviceLocked(*copy.slot);
  } else {
    EndRequestLocked(*copy.transfer, copy.bytes, absl::OkStatus());
  }
}

void UcxAgentImpl::ForceStuckCancelsLocked() {
  const absl::Time now = absl::Now();
  std::vector<Conn*> stuck;
  transfers_.ForEach([&](Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!t.ended && !t.requests.empty() && now - t.cancelled_at > kCancelForceAfter &&
        t.conn->state == Conn::State::kActive) {
      stuck.push_back(t.conn);
    }
  });
  for (Conn* conn : stuck) {
    if (conn->state != Conn::State::kActive) continue;  // listed twice
    LOG(WARNING) << "UCX peer did not complete cancelled reads within "
                 << absl::FormatDuration(kCancelForceAfter) << ": closing its connection";
    StopConnLocked(conn, absl::UnavailableError("KV source did not answer (connection closed)"));
    conn->draining_since = absl::InfinitePast();  // force-close its endpoints at once
  }
}

bool UcxAgentImpl::ReapConnsLocked() {
  // The common case (every endpoint active) without the snapshot's allocation: this runs once
  // per progress loop, i.e. per direct copy.
  if (std::all_of(conns_.begin(), conns_.end(), [](const std::unique_ptr<Conn>& c) {
        return c->state == Conn::State::kActive;
      })) {
    return false;
  }
  bool pending = false;
  // Iterate over a snapshot: freeing a Conn erases it from conns_.
  std::vector<Conn*> snapshot;
  for (const auto& c : conns_) snapshot.push_back(c.get());
  for (Conn* conn : snapshot) {
    if (conn->state == Conn::State::kDraining) {
      // A failed peer (separate endpoints): close both endpoints right away, the monitor's
      // failed requests complete as cancelled before the transfers are reported ended.
      const bool abandon = conn->monitor_ep != nullptr && !conn->failure.ok();
      const bool stuck = abandon || absl::Now() - conn->draining_since > kDrainForceAfter;
      if (conn->inflight > 0 && !stuck) {
        pending = true;
        continue;
      }
      // rkeys go after the operations that used them and before the endpoint (UCX's rule);
      // only a stuck endpoint is closed first, which completes its requests as cancelled.
      if (conn->inflight == 0) DestroyRkeysLocked(conn);
      for (ucp_ep_h* ep : {&conn->ep, &conn->monitor_ep}) {
        if (*ep == nullptr) continue;
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // bounded: never waits for the peer
        ucs_status_ptr_t request = ucp_ep_close_nbx(*ep, &param);
        if (request != nullptr && !UCS_PTR_IS_ERR(request)) conn->close_requests.push_back(request);
        *ep = nullptr;
      }
      conn->state = Conn::State::kClosing;
    }
    if (conn->state == Conn::State::kClosing) {
      bool closing = false;
      for (void*& request : conn->close_requests) {
        if (ucp_request_check_status(request) == UCS_INPROGRESS) {
          closing = true;
        } else {
          ucp_request_free(request);
          request = nullptr;
        }
      }
      std::erase(conn->close_requests, nullptr);
      if (closing || conn->inflight > 0) {
        pending = true;
        continue;
      }
      DestroyRkeysLocked(conn);
      conn->state = Conn::State::kClosed;
    }
    if (conn->state == Conn::State::kClosed) MaybeFreeConnLocked(conn);
  }
  return pending;
}

void UcxAgentImpl::DestroyRkeysLocked(Conn* conn) {
  for (RemoteRegion& r : conn->regions) {
    r.pins.reset();  // unpins the mapping before the unmap
    ucp_rkey_destroy(r.rkey);
  }
  conn->regions.clear();
}

void UcxAgentImpl::MaybeFreeConnLocked(Conn* conn) {
  if (conn->state != Conn::State::kClosed || conn->pinned) return;
  for (const auto& [name, c] : peers_) {
    if (c == conn) return;  // tombstone of a failed peer
  }
  // Ended transfers may still point at it; they never dereference it again.
  transfers_.ForEach([conn](Transfer& t) {
    if (t.conn == conn) t.conn = nullptr;
  });
  conns_.erase(std::find_if(conns_.begin(), conns_.end(),
                            [conn](const std::unique_ptr<Conn>& c) { return c.get() == conn; }));
}

void UcxAgentImpl::ProgressLoop() {
  while (true) {
    bool busy = false;
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      while (ucp_worker_progress(worker_) != 0) busy = true;
      busy |= PollStagingLocked();
      // Queuing a direct copy is bookkeeping only, so fill the in-flight window with them at
      // once (the helpers start on them right away); a UCX GET may copy inside ucp_get_nbx, so
      // at most one of those per round.
      for (Posted posted = PostOneLocked(); posted != Posted::kNothing; posted = PostOneLocked()) {
        busy = true;
        if (posted == Posted::kRequest) break;
      }
      ForceStuckCancelsLocked();
      const bool reaping = ReapConnsLocked();
      if (!copy_queue_.empty()) {
        RunQueuedCopyLocked();  // the progress thread is one of the copy threads
        continue;
      }
      // Direct copies running on helpers need no polling: a helper wakes this thread when its
      // copy frees room in the window for more posts, or leaves something to poll.
      idle = !busy && !reaping && inflight_requests_ == direct_copies_;
    }
    if (idle) {
      WaitIdle();
    } else if (!busy) {
      std::this_thread::yield();  // requests in flight: poll, but let the peer's threads run
    }
  }
}

void UcxAgentImpl::CopyLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &UcxAgentImpl::CopyWorkOrStopLocked));
    if (stop_) return;
    RunQueuedCopyLocked();
    // More to post (the copy freed room in the window), or a staged request's device copy or a
    // draining endpoint to poll: the progress thread may be asleep.
    if (!post_queue_.empty() || inflight_requests_ > direct_copies_ ||
        std::any_of(conns_.begin(), conns_.end(), [](const std::unique_ptr<Conn>& c) {
          return c->state != Conn::State::kActive;
        })) {
      Wake();
    }
  }
}

void UcxAgentImpl::WaitIdle() {
  int timeout_ms = 1;  // without a worker fd: short sleeps
  if (worker_fd_ >= 0) {
    absl::MutexLock lock(&mu_);
    const ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) return;  // events pending: progress again
    if (s == UCS_OK) {
      timeout_ms =
          static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.idle_wakeup)));
    }
  }
  epoll_event events[2];
  epoll_wait(epoll_fd_, events, 2, timeout_ms);
  uint64_t drained = 0;
  [[maybe_unused]] ssize_t r = read(wake_fd_, &drained, sizeof(drained));
}

void UcxAgentImpl::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof(one));
}

}  // namespace tandem::kvtransfer
