#include "kvtransfer/nccl_agent.h"

#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/nccl_status.h"
#include "common/status_macros.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl_agent_socket.h"
#include "kvtransfer/nccl_agent_wire.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

using nccl_wire::MessageType;

struct NcclAgent::Transfer {
  TransferId id = 0;
  std::vector<CopyOp> ops;  // coalesced
  uint64_t bytes = 0;
  bool posted = false;  // its kRead went out: it can no longer be withdrawn
  bool cancel = false;
  bool ended = false;
  absl::Status result;
};

// Outgoing connection: this agent reads from the peer (rank 0 of the pair's communicator).
struct NcclAgent::Peer {
  std::string name;
  std::string host;
  int port = 0;
  std::vector<uint64_t> remote_bytes;
  std::deque<TransferId> queue;  // guarded by the agent's mu_
  bool ready = false;            // guarded by mu_: init finished (see init_status)
  absl::Status init_status;      // guarded by mu_
  absl::Status failure;          // guarded by mu_: not OK once the connection died
  std::atomic<bool> stop{false};
  std::thread thread;
};

// Incoming connection: this agent is the source (rank 1).
struct NcclAgent::Served {
  int fd = -1;
  std::atomic<bool> stop{false};
  std::thread thread;
};

namespace {

// Owns a communicator, stream and event on the calling thread's device. Teardown always aborts:
// ncclCommAbort is local (no peer needed) and stops in-flight kernels, then the stream is drained
// so no more bytes land in registered memory.
struct CommState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  ~CommState() {
    if (comm != nullptr) ncclCommAbort(comm);
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    if (event != nullptr) cudaEventDestroy(event);
  }
  absl::Status Init(int device, const ncclUniqueId& id, int rank) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, 2, id, rank));
    return absl::OkStatus();
  }
  // Waits for the work recorded on the stream, watching the control socket for the peer's death
  // and `stop`. OK when the stream finished.
  absl::Status Wait(int fd, const std::atomic<bool>& stop) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream));
    for (;;) {
      cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) CUDA_RETURN_IF_ERROR(q);
      ncclResult_t async = ncclSuccess;
      NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &async));
      NCCL_RETURN_IF_ERROR(async);
      if (stop.load()) return absl::CancelledError("nccl agent: connection stopped");
      RETURN_IF_ERROR(nccl_socket::CheckAlive(fd));
      std::this_thread::yield();
    }
  }
};

}  // namespace

NcclAgent::NcclAgent(NcclAgentOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<NcclAgent>> NcclAgent::Create(NcclAgentOptions options) {
  std::unique_ptr<NcclAgent> agent(new NcclAgent(std::move(options)));
  RETURN_IF_ERROR(agent->Init());
  return agent;
}

absl::Status NcclAgent::Init() {
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options_.device < 0 || options_.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl agent: device ", options_.device, " of ", count));
  }
  int port = 0;
  ASSIGN_OR_RETURN(listen_fd_,
                   nccl_socket::Listen(options_.control_host, options_.control_port, &port));
  address_ = nccl_wire::FormatAddress(options_.control_host, port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("nccl agent: eventfd failed");
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

NcclAgent::~NcclAgent() {
  std::vector<std::unique_ptr<Peer>> peers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [name, peer] : peers_) peers.push_back(std::move(peer));
    peers_.clear();
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  for (auto& peer : peers) StopPeer(peer.get());
  std::vector<std::unique_ptr<Served>> served;
  {
    absl::MutexLock lock(&mu_);
    served = std::move(served_);
  }
  for (auto& s : served) {
    s->stop = true;
    if (s->thread.joinable()) s->thread.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::StatusOr<uint32_t> NcclAgent::RegisterMemory(void* base, uint64_t length,
                                                   tandem::v1::MemoryKind kind) {
  if (kind != tandem::v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl agent registers CUDA device memory only, not kind ", kind));
  }
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("nccl agent: empty region");
  }
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= static_cast<size_t>(tandem::v1::kMaxMemoryRegions)) {
    return absl::ResourceExhaustedError("nccl agent: too many regions");
  }
  regions_.push_back({static_cast<char*>(base), length});
  return static_cast<uint32_t>(regions_.size() - 1);
}

absl::Status NcclAgent::FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) {
  absl::MutexLock lock(&mu_);
  handshake->set_transport(transport());
  handshake->set_worker_address(address_);
  handshake->clear_regions();
  for (const Region& r : regions_) {
    tandem::v1::MemoryRegion* region = handshake->add_regions();
    region->set_base_address(reinterpret_cast<uint64_t>(r.base));
    region->set_length(r.length);
    region->set_kind(tandem::v1::MEMORY_KIND_CUDA);
  }
  return absl::OkStatus();
}

absl::Status NcclAgent::AddPeer(const std::string& peer_name,
                                const tandem::v1::TransferHandshake& desc) {
  const std::string who = absl::StrCat("peer ", peer_name);
  if (desc.transport() != transport()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " speaks transport '", desc.transport(), "', not 'nccl'"));
  }
  if (desc.regions_size() > tandem::v1::kMaxMemoryRegions) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": too many regions"));
  }
  auto peer = std::make_unique<Peer>();
  peer->name = peer_name;
  absl::Status parsed = nccl_wire::ParseAddress(desc.worker_address(), &peer->host, &peer->port);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(who, ": ", parsed.message()));
  for (const tandem::v1::MemoryRegion& r : desc.regions()) {
    if (r.kind() != tandem::v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": region of kind ", r.kind()));
    }
    peer->remote_bytes.push_back(r.length());
  }
  Peer* p = peer.get();
  p->thread = std::thread([this, p] { PeerLoop(p); });
  absl::Status init;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Peer* q) { return q->ready; }, p));
    init = p->init_status;
  }
  if (!init.ok()) {
    p->stop = true;
    p->thread.join();
    return init;
  }
  std::unique_ptr<Peer> old;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      old = std::move(peer);
    } else {
      auto& slot = peers_[peer_name];
      old = std::move(slot);
      slot = std::move(peer);
      stats_.peers = peers_.size();
    }
  }
  if (old != nullptr) StopPeer(old.get());
  return absl::OkStatus();
}

void NcclAgent::StopPeer(Peer* peer) {
  peer->stop = true;
  if (peer->thread.joinable()) peer->thread.join();
}

void NcclAgent::RemovePeer(const std::string& peer_name) {
  std::unique_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer_name);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
    stats_.peers = peers_.size();
  }
  StopPeer(peer.get());
}

absl::StatusOr<TransferId> NcclAgent::PostRead(const std::string& peer_name,
                                               absl::Span<const CopyOp> ops) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_name);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("unknown peer ", peer_name));
  Peer* peer = it->second.get();
  if (!peer->failure.ok()) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer_name, " failed: ", peer->failure.message()));
  }
  std::vector<uint64_t> local_bytes;
  for (const Region& r : regions_) local_bytes.push_back(r.length);
  RETURN_IF_ERROR(ValidateCopyOps(ops, local_bytes, peer->remote_bytes));
  if (ops.size() > nccl_wire::kMaxOpsPerRead) {
    return absl::InvalidArgumentError(absl::StrCat("nccl agent: batch of ", ops.size(), " ops"));
  }
  auto t = std::make_unique<Transfer>();
  t->id = next_id_++;
  t->ops = CoalesceCopyOps(ops);
  t->bytes = TotalBytes(t->ops);
  const TransferId id = t->id;
  transfers_[id] = std::move(t);
  peer->queue.push_back(id);
  return id;
}

void NcclAgent::EndLocked(Transfer* t, absl::Status result) {
  if (t->ended) return;
  t->ended = true;
  t->result = std::move(result);
  if (t->result.ok()) {
    stats_.bytes_read += t->bytes;
    ++stats_.transfers_completed;
  } else {
    ++stats_.transfers_failed;
  }
}

absl::StatusOr<bool> NcclAgent::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return absl::NotFoundError(absl::StrCat("unknown transfer ", id));
  if (!it->second->ended) return false;
  absl::Status result = std::move(it->second->result);
  transfers_.erase(it);
  if (!result.ok()) return result;
  return true;
}

void NcclAgent::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->ended) return;
  Transfer* t = it->second.get();
  t->cancel = true;
  if (t->posted) return;  // NCCL ops cannot be withdrawn: ends CANCELLED once they finish
  for (auto& [name, peer] : peers_) {
    auto& q = peer->queue;
    for (auto qi = q.begin(); qi != q.end(); ++qi) {
      if (*qi == id) {
        q.erase(qi);
        break;
      }
    }
  }
  EndLocked(t, absl::CancelledError(absl::StrCat("transfer ", id, " cancelled")));
}

TransferAgentStats NcclAgent::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void NcclAgent::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto served = std::make_unique<Served>();
    served->fd = fd;
    Served* s = served.get();
    absl::MutexLock lock(&mu_);
    if (stop_) {
      close(fd);
      return;
    }
    s->thread = std::thread([this, s] { ServeLoop(s); });
    served_.push_back(std::move(served));
  }
}

void NcclAgent::ServeLoop(Served* served) {
  const int fd = served->fd;
  MessageType type;
  std::string payload;
  // The reader's hello follows its connect at once; a long wait means a stray client.
  absl::Status s = nccl_socket::RecvFrame(fd, served->stop, absl::Seconds(30), &type, &payload);
  if (!s.ok() || type != MessageType::kHello || payload.size() != sizeof(ncclUniqueId)) {
    close(fd);
    return;
  }
  ncclUniqueId id;
  std::memcpy(&id, payload.data(), sizeof(id));
  {
    CommState comm;
    if (!comm.Init(options_.device, id, /*rank=*/1).ok()) {
      close(fd);
      return;
    }
    while (!served->stop.load()) {
      s = nccl_socket::RecvFrame(fd, served->stop, absl::InfiniteDuration(), &type, &payload);
      if (!s.ok() || type != MessageType::kRead) break;
      absl::StatusOr<nccl_wire::ReadRequest> req = nccl_wire::DecodeReadRequest(payload);
      if (!req.ok()) break;  // the peer speaks garbage: drop the connection
      std::vector<Region> regions;
      {
        absl::MutexLock lock(&mu_);
        regions = regions_;
      }
      std::vector<uint64_t> bytes;
      for (const Region& r : regions) bytes.push_back(r.length);
      absl::Status verdict = nccl_wire::ValidateSourceRanges(req->ops, bytes);
      if (!nccl_socket::SendFrame(fd, MessageType::kReadAck,
                                  nccl_wire::EncodeReadAck(req->id, verdict))
               .ok()) {
        break;
      }
      if (!verdict.ok()) continue;
      ncclResult_t r = ncclGroupStart();
      for (const CopyOp& op : req->ops) {
        if (r != ncclSuccess) break;
        r = ncclSend(regions[op.remote_region].base + op.remote_offset, op.length, ncclInt8,
                     /*peer=*/0, comm.comm, comm.stream);
      }
      ncclResult_t end = ncclGroupEnd();
      if (r != ncclSuccess || end != ncclSuccess) break;
      if (!comm.Wait(fd, served->stop).ok()) break;
    }
  }  // aborts the communicator and drains the stream
  close(fd);
}

absl::Status NcclAgent::RunTransfer(Peer* peer, Transfer* t, void* comm_state, int fd,
                                    absl::Status* result) {
  CommState& comm = *static_cast<CommState*>(comm_state);
  ASSIGN_OR_RETURN(std::string request, nccl_wire::EncodeReadRequest(t->id, t->ops));
  RETURN_IF_ERROR(nccl_socket::SendFrame(fd, MessageType::kRead, request));
  MessageType type;
  std::string payload;
  RETURN_IF_ERROR(
      nccl_socket::RecvFrame(fd, peer->stop, absl::InfiniteDuration(), &type, &payload));
  uint64_t id = 0;
  absl::Status verdict;
  if (type != MessageType::kReadAck || !nccl_wire::DecodeReadAck(payload, &id, &verdict).ok() ||
      id != t->id) {
    return absl::UnavailableError("nccl agent: bad answer from the source");
  }
  if (!verdict.ok()) {
    *result = verdict;
    return absl::OkStatus();
  }
  std::vector<Region> regions;
  {
    absl::MutexLock lock(&mu_);
    regions = regions_;
  }
  NCCL_RETURN_IF_ERROR(ncclGroupStart());
  ncclResult_t r = ncclSuccess;
  for (const CopyOp& op : t->ops) {
    r = ncclRecv(regions[op.local_region].base + op.local_offset, op.length, ncclInt8,
                 /*peer=*/1, comm.comm, comm.stream);
    if (r != ncclSuccess) break;
  }
  ncclResult_t end = ncclGroupEnd();
  NCCL_RETURN_IF_ERROR(r);
  NCCL_RETURN_IF_ERROR(end);
  RETURN_IF_ERROR(comm.Wait(fd, peer->stop));
  *result = absl::OkStatus();
  return absl::OkStatus();
}

void NcclAgent::PeerLoop(Peer* peer) {
  auto comm = std::make_unique<CommState>();
  int fd = -1;
  absl::Status init = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(fd, nccl_socket::Connect(peer->host, peer->port, options_.connect_timeout));
    ncclUniqueId id;
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    RETURN_IF_ERROR(
        nccl_socket::SendFrame(fd, MessageType::kHello,
                               absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
    return comm->Init(options_.device, id, /*rank=*/0);
  }();
  if (!init.ok()) {
    comm.reset();
    if (fd >= 0) close(fd);
    absl::MutexLock lock(&mu_);
    peer->init_status = absl::UnavailableError(
        absl::StrCat("nccl agent: cannot connect to peer ", peer->name, ": ", init.message()));
    peer->ready = true;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    peer->ready = true;
  }
  absl::Status conn_status;  // why the loop ended
  Transfer* current = nullptr;
  while (conn_status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [peer] { return !peer->queue.empty() || peer->stop.load(); };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(20));
      if (peer->stop.load()) break;
      if (!peer->queue.empty()) {
        current = transfers_[peer->queue.front()].get();
        peer->queue.pop_front();
        current->posted = true;
      }
    }
    if (current == nullptr) {
      conn_status = nccl_socket::CheckAlive(fd);
      continue;
    }
    absl::Status result;
    conn_status = RunTransfer(peer, current, comm.get(), fd, &result);
    if (!conn_status.ok()) break;
    absl::MutexLock lock(&mu_);
    EndLocked(current, current->cancel && result.ok() ? absl::CancelledError(absl::StrCat(
                                                            "transfer ", current->id, " cancelled"))
                                                      : result);
    current = nullptr;
  }
  comm.reset();  // abort + drain: nothing more lands in our memory
  close(fd);
  absl::MutexLock lock(&mu_);
  absl::Status reason =
      peer->stop.load()
          ? absl::CancelledError(absl::StrCat("peer ", peer->name, " removed"))
          : absl::UnavailableError(absl::StrCat("peer ", peer->name, ": ", conn_status.message()));
  if (!peer->stop.load()) peer->failure = reason;
  if (current != nullptr) EndLocked(current, reason);
  for (TransferId id : peer->queue) EndLocked(transfers_[id].get(), reason);
  peer->queue.clear();
}

}  // namespace tandem::kvtransfer
