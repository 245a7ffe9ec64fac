// The reader side: one thread per peer (PeerLoop, rank 0 of the pair's communicators) sends the
// peer's queued transfers as kReads, puts the acknowledged ones' receives on the GPU and ends
// them as they finish.
#include <unistd.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/nccl_status.h"
#include "common/status_macros.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_auth.h"
#include "kvtransfer/nccl/nccl_agent_internal.h"
#include "kvtransfer/nccl/nccl_agent_link.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer {
namespace {

using nccl_agent_internal::LinkOptions;
using nccl_agent_internal::OpShapes;
using nccl_wire::MessageType;

}  // namespace

absl::Status NcclAgent::ReadAcks(Peer* peer, int fd, NcclLink* link, std::deque<Posted>* awaiting,
                                 std::deque<Posted>* running) {
  while (!awaiting->empty()) {
    absl::Status s = nccl_socket::WaitReadable(fd, peer->stop, absl::ZeroDuration());
    if (absl::IsDeadlineExceeded(s)) return absl::OkStatus();  // nothing more yet
    RETURN_IF_ERROR(s);
    MessageType type;
    std::string payload;
    RETURN_IF_ERROR(
        nccl_socket::RecvFrame(fd, peer->stop, options_.transfer_timeout, &type, &payload));
    absl::StatusOr<nccl_wire::ReadAck> ack = type == MessageType::kReadAck
                                                 ? nccl_wire::DecodeReadAck(payload)
                                                 : absl::InvalidArgumentError("not an ack");
    // A transfer is always in `awaiting` or `running` until it ends: on any error below it
    // stays in one of them, and the connection's teardown ends it (PeerLoop). (It used to leave
    // `awaiting` before Enqueue, so an Enqueue stopped by RemovePeer lost it: it never ended.)
    Transfer* t = awaiting->front().t;
    if (!ack.ok() || ack->id != t->id) {
      return absl::UnavailableError("nccl agent: bad answer from the source");
    }
    if (!ack->verdict.ok()) {
      awaiting->pop_front();
      absl::MutexLock lock(&mu_);
      EndLocked(t, ack->verdict);
      continue;
    }
    if (ack->chunk_bytes > options_.staging_chunk_bytes) {
      return absl::UnavailableError(absl::StrCat("nccl agent: the source chose chunks of ",
                                                 ack->chunk_bytes, " bytes, above ours"));
    }
    ASSIGN_OR_RETURN(
        nccl_plan::Plan plan,
        nccl_plan::MakePlan(OpShapes(t->ops), {ack->chunk_bytes, options_.direct_min_bytes}));
    awaiting->pop_front();
    running->push_back(
        {t, running->empty() ? absl::Now() + options_.transfer_timeout : absl::InfiniteFuture()});
    RETURN_IF_ERROR(link->Enqueue(plan, OpPlaces(t->ops, /*local=*/true)));
  }
  return absl::OkStatus();
}

absl::Status NcclAgent::RetireFinished(NcclLink* link, std::deque<Posted>* running) {
  while (!running->empty()) {
    ASSIGN_OR_RETURN(bool done, link->PollOldest());
    if (!done) return absl::OkStatus();
    Transfer* t = running->front().t;
    running->pop_front();
    if (!running->empty()) running->front().deadline = absl::Now() + options_.transfer_timeout;
    absl::MutexLock lock(&mu_);
    EndLocked(t, t->cancel ? absl::CancelledError(absl::StrCat("transfer ", t->id, " cancelled"))
                           : absl::OkStatus());
  }
  return absl::OkStatus();
}

absl::Status NcclAgent::ConnectPeer(Peer* peer, int* fd, std::unique_ptr<NcclLink>* link) {
  ASSIGN_OR_RETURN(*fd, nccl_socket::Connect(peer->host, peer->port, options_.connect_timeout));
  std::vector<ncclUniqueId> ids(static_cast<size_t>(options_.num_comms));
  for (ncclUniqueId& id : ids) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  // Answers the source's challenge with a proof of its access token (nccl_agent_auth.h).
  RETURN_IF_ERROR(nccl_auth::SendHello(
      *fd, peer->token,
      absl::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(ids[0])),
      peer->stop, options_.init_timeout));
  ASSIGN_OR_RETURN(*link, NcclLink::Connect(LinkOptions(options_), NcclLink::Role::kReceiver, ids,
                                            *fd, peer->stop));
  return absl::OkStatus();
}

absl::Status NcclAgent::SendReads(int fd, const std::vector<Transfer*>& fresh, bool alone,
                                  std::deque<Posted>* awaiting) {
  const nccl_plan::PlanParams params{options_.staging_chunk_bytes, options_.direct_min_bytes};
  // All of them into `awaiting` first: if a send fails, the teardown ends them all.
  for (Transfer* t : fresh) awaiting->push_back({t, absl::Now() + options_.transfer_timeout});
  for (Transfer* t : fresh) {
    nccl_plan::PlanParams p = params;
    if (alone) {
      p.chunk_bytes = nccl_plan::LoneTransferChunk(t->bytes, options_.staging_chunk_bytes,
                                                   options_.lone_min_chunk_bytes);
    }
    absl::StatusOr<std::string> request = nccl_wire::EncodeReadRequest(t->id, p, t->ops);
    RETURN_IF_ERROR(request.status());
    RETURN_IF_ERROR(nccl_socket::SendFrame(fd, MessageType::kRead, *request));
  }
  return absl::OkStatus();
}

void NcclAgent::EndConnectionLocked(Peer* peer, const absl::Status& conn_status,
                                    const std::deque<Posted>& awaiting,
                                    const std::deque<Posted>& running) {
  absl::Status reason =
      peer->stop.load()
          ? absl::CancelledError(absl::StrCat("peer ", peer->name, " removed"))
          : absl::UnavailableError(absl::StrCat("peer ", peer->name, ": ", conn_status.message()));
  if (!peer->stop.load()) peer->failure = reason;
  for (const std::deque<Posted>* q : {&awaiting, &running}) {
    for (const Posted& p : *q) EndLocked(p.t, reason);
  }
  for (TransferId id : peer->queue) EndLocked(transfers_.Find(id), reason);
  peer->queue.clear();
}

void NcclAgent::PeerLoop(Peer* peer) {
  std::unique_ptr<NcclLink> link;
  int fd = -1;
  absl::Status init = ConnectPeer(peer, &fd, &link);
  if (!init.ok()) {
    link.reset();
    if (fd >= 0) close(fd);
    const std::string what =
        absl::StrCat("nccl agent: cannot connect to peer ", peer->name, ": ", init.message());
    absl::MutexLock lock(&mu_);
    peer->init_status = absl::IsDeadlineExceeded(init) ? absl::DeadlineExceededError(what)
                                                       : absl::UnavailableError(what);
    peer->ready = true;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    peer->ready = true;
  }
  const size_t window = static_cast<size_t>(options_.max_posted_transfers);
  std::deque<Posted> awaiting;  // kRead sent, no ack yet
  std::deque<Posted> running;   // on the GPU
  absl::Status conn_status;     // why the loop ended
  while (conn_status.ok()) {
    std::vector<Transfer*> fresh;
    bool idle = false;
    if (peer->stop.load()) break;
    if (awaiting.size() + running.size() < window) {  // else: no need to contend for mu_
      absl::MutexLock lock(&mu_);
      if (awaiting.empty() && running.empty()) {
        auto has_work = [peer] { return !peer->queue.empty() || peer->stop.load(); };
        idle = !mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(20));
      }
      if (peer->stop.load()) break;
      while (awaiting.size() + running.size() + fresh.size() < window && !peer->queue.empty()) {
        Transfer* t = transfers_.Find(peer->queue.front());
        peer->queue.pop_front();
        t->posted = true;
        fresh.push_back(t);
      }
    }
    if (idle) {  // nothing may arrive now: readable means EOF or garbage
      conn_status = nccl_socket::CheckAlive(fd);
      continue;
    }
    const bool alone = fresh.size() == 1 && awaiting.empty() && running.empty();
    conn_status = SendReads(fd, fresh, alone, &awaiting);
    if (!conn_status.ok()) break;
    conn_status = ReadAcks(peer, fd, link.get(), &awaiting, &running);
    if (conn_status.ok()) conn_status = RetireFinished(link.get(), &running);
    if (!conn_status.ok()) break;
    if (awaiting.empty() && !running.empty()) conn_status = nccl_socket::CheckAlive(fd);
    const absl::Time now = absl::Now();
    for (const std::deque<Posted>* q : {&awaiting, &running}) {
      if (conn_status.ok() && !q->empty() && now > q->front().deadline) {
        conn_status = absl::UnavailableError(absl::StrCat(
            "transfer ", q->front().t->id, " made no progress within ",
            absl::FormatDuration(options_.transfer_timeout), " (silent peer); aborted"));
      }
    }
    if (!awaiting.empty() || !running.empty()) std::this_thread::yield();
  }
  link.reset();  // abort + drain: nothing more lands in our memory
  close(fd);
  absl::MutexLock lock(&mu_);
  EndConnectionLocked(peer, conn_status, awaiting, running);
}

}  // namespace tandem::kvtransfer
