#include "kvtransfer/nccl/nccl_agent.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/nccl_status.h"
#include "common/status_macros.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent_link.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

using nccl_wire::MessageType;

struct NcclAgent::Transfer {
  TransferId id = 0;
  std::vector<StridedCopyOp> ops;  // coalesced; a contiguous op is one row
  uint64_t bytes = 0;
  bool posted = false;  // its kRead went out: it can no longer be withdrawn
  bool cancel = false;
  bool ended = false;
  absl::Status result;
};

// Outgoing connection: this agent reads from the peer (rank 0 of the pair's communicator).
struct NcclAgent::Peer {
  std::string name;
  std::string token;  // the source's access token (desc.access_token), sent in the hello
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

// A reader-side transfer whose kRead went out. Owned by the peer thread; the Transfer itself
// stays in transfers_ (guarded by mu_).
struct NcclAgent::Posted {
  Transfer* t = nullptr;
  absl::Time deadline;  // of the ack (awaiting), or of finishing once it is the oldest (running)
};

namespace {

static_assert(sizeof(ncclUniqueId) == nccl_wire::kUniqueIdBytes);

// The source keeps at most this many transfers of one reader on the GPU; more kReads wait.
constexpr size_t kMaxServedInFlight = 16;

NcclLinkOptions LinkOptions(const NcclAgentOptions& o) {
  NcclLinkOptions l;
  l.device = o.device;
  l.staging_chunk_bytes = o.staging_chunk_bytes;
  l.staging_buffers = o.staging_buffers;
  l.copy_ctas = o.copy_ctas;
  l.copy_mode = o.copy_mode;
  l.init_timeout = o.init_timeout;
  return l;
}

std::vector<nccl_plan::OpShape> OpShapes(absl::Span<const StridedCopyOp> ops) {
  std::vector<nccl_plan::OpShape> out;
  out.reserve(ops.size());
  for (const StridedCopyOp& op : ops) out.push_back({op.row_bytes, op.rows});
  return out;
}

// Coalesced; ops whose rows follow each other on both sides become one row, so they may travel
// as direct messages (the plan sends strided ops only packed).
std::vector<StridedCopyOp> Normalized(absl::Span<const StridedCopyOp> ops) {
  std::vector<StridedCopyOp> out = CoalesceStridedCopyOps(ops);
  for (StridedCopyOp& op : out) {
    if (op.rows > 1 && op.local_stride == op.row_bytes && op.remote_stride == op.row_bytes) {
      op.row_bytes *= op.rows;  // validated: inside a region
      op.rows = 1;
      op.local_stride = op.remote_stride = op.row_bytes;
    }
  }
  return out;
}

}  // namespace

NcclAgent::NcclAgent(NcclAgentOptions options)
    : options_(std::move(options)),
      auth_(options_.control_token_key, options_.control_token_lifetime) {}

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
  RETURN_IF_ERROR(auth_.Validate());
  const NcclAgentOptions& o = options_;
  if (o.staging_chunk_bytes == 0 || o.staging_buffers < 1 || o.direct_min_bytes == 0 ||
      o.copy_ctas < 1 || o.max_posted_transfers < 1 || o.init_timeout <= absl::ZeroDuration() ||
      o.transfer_timeout <= absl::ZeroDuration() || o.num_comms < 1 || o.num_comms > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl agent: bad options: staging_chunk_bytes ", o.staging_chunk_bytes,
        ", staging_buffers ", o.staging_buffers, ", direct_min_bytes ", o.direct_min_bytes,
        ", copy_ctas ", o.copy_ctas, ", max_posted_transfers ", o.max_posted_transfers,
        ", init_timeout ", absl::FormatDuration(o.init_timeout), ", transfer_timeout ",
        absl::FormatDuration(o.transfer_timeout), ", num_comms ", o.num_comms, " (1 or 2)"));
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
  if (desc.access_token().size() > nccl_wire::kMaxHelloTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": access token too long"));
  }
  auto peer = std::make_unique<Peer>();
  peer->name = peer_name;
  peer->token = desc.access_token();
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

absl::StatusOr<NcclAgent::Peer*> NcclAgent::PostTargetLocked(const std::string& peer_name,
                                                             size_t num_ops,
                                                             std::vector<uint64_t>* local_bytes) {
  if (num_ops > nccl_wire::kMaxOpsPerRead) {
    return absl::InvalidArgumentError(absl::StrCat("nccl agent: batch of ", num_ops, " ops"));
  }
  auto it = peers_.find(peer_name);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("unknown peer ", peer_name));
  Peer* peer = it->second.get();
  if (!peer->failure.ok()) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer_name, " failed: ", peer->failure.message()));
  }
  for (const Region& r : regions_) local_bytes->push_back(r.length);
  return peer;
}

TransferId NcclAgent::QueueLocked(Peer* peer, std::vector<StridedCopyOp> ops) {
  auto t = std::make_unique<Transfer>();
  t->ops = std::move(ops);
  t->bytes = TotalBytes(t->ops);
  const TransferId id = transfers_.Add(std::move(t))->id;
  peer->queue.push_back(id);
  return id;
}

absl::StatusOr<TransferId> NcclAgent::PostRead(const std::string& peer_name,
                                               absl::Span<const CopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Peer * peer, PostTargetLocked(peer_name, ops.size(), &local_bytes));
  RETURN_IF_ERROR(ValidateCopyOps(ops, local_bytes, peer->remote_bytes));
  std::vector<StridedCopyOp> rows;
  rows.reserve(ops.size());
  for (const CopyOp& op : CoalesceCopyOps(ops)) rows.push_back(AsStrided(op));
  return QueueLocked(peer, std::move(rows));
}

bool NcclAgent::CanReadStrided(const std::string& peer_name, uint32_t local_region) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_name);
  return it != peers_.end() && it->second->failure.ok() && local_region < regions_.size();
}

absl::StatusOr<TransferId> NcclAgent::PostStridedRead(const std::string& peer_name,
                                                      absl::Span<const StridedCopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Peer * peer, PostTargetLocked(peer_name, ops.size(), &local_bytes));
  RETURN_IF_ERROR(ValidateStridedCopyOps(ops, local_bytes, peer->remote_bytes));
  return QueueLocked(peer, Normalized(ops));
}

void NcclAgent::EndLocked(Transfer* t, absl::Status result) {
  transfers_.End(*t, std::move(result), t->bytes, &stats_);
}

absl::StatusOr<bool> NcclAgent::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  return transfers_.Check(id);
}

void NcclAgent::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  Transfer* t = transfers_.Find(id);
  if (t == nullptr || t->ended) return;
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

std::vector<nccl_plan::OpPlace> NcclAgent::OpPlaces(absl::Span<const StridedCopyOp> ops,
                                                    bool local) const {
  absl::MutexLock lock(&mu_);
  std::vector<nccl_plan::OpPlace> out;
  out.reserve(ops.size());
  for (const StridedCopyOp& op : ops) {
    const Region& r = regions_[local ? op.local_region : op.remote_region];
    out.push_back(
        {reinterpret_cast<uint64_t>(r.base) + (local ? op.local_offset : op.remote_offset),
         local ? op.local_stride : op.remote_stride});
  }
  return out;
}

void NcclAgent::ServeLoop(Served* served) {
  const int fd = served->fd;
  MessageType type;
  std::string payload;
  // The reader's hello answers our challenge at once (a long wait means a stray client), and
  // must prove a token we issued before anything else happens (nccl_agent_auth.h). One
  // ncclUniqueId per communicator: the reader picks how many.
  absl::StatusOr<std::string> hello =
      nccl_auth::AcceptHello(fd, auth_, served->stop, options_.init_timeout);
  if (!hello.ok()) {
    close(fd);
    return;
  }
  std::vector<ncclUniqueId> ids(hello->size() / sizeof(ncclUniqueId));
  std::memcpy(ids.data(), hello->data(), hello->size());
  absl::Status s;
  absl::StatusOr<std::unique_ptr<NcclLink>> link =
      NcclLink::Connect(LinkOptions(options_), NcclLink::Role::kSender, ids, fd, served->stop);
  if (!link.ok()) {
    close(fd);
    return;
  }
  absl::Time oldest_deadline = absl::InfiniteFuture();  // of the oldest transfer on the GPU
  // Ends with the connection: the reader hung up, spoke garbage, went silent, or stop.
  while (!served->stop.load()) {
    const size_t before = (*link)->in_flight();
    absl::Status polled;
    while ((*link)->in_flight() > 0) {
      absl::StatusOr<bool> done = (*link)->PollOldest();
      polled = done.status();
      if (!done.ok() || !*done) break;
    }
    if (!polled.ok()) break;
    const absl::Time now = absl::Now();
    if ((*link)->in_flight() < before) oldest_deadline = now + options_.transfer_timeout;
    if ((*link)->in_flight() > 0 && now > oldest_deadline) break;  // the reader went silent
    const bool busy = (*link)->in_flight() > 0;
    // A full GPU queue takes no new kRead until its oldest transfer ended.
    if (busy && (*link)->in_flight() >= kMaxServedInFlight) {
      std::this_thread::yield();
      continue;
    }
    s = nccl_socket::WaitReadable(fd, served->stop,
                                  busy ? absl::ZeroDuration() : absl::Milliseconds(20));
    if (absl::IsDeadlineExceeded(s)) {
      if (busy) std::this_thread::yield();
      continue;
    }
    if (!s.ok()) break;
    s = nccl_socket::RecvFrame(fd, served->stop, options_.transfer_timeout, &type, &payload);
    if (!s.ok() || type != MessageType::kRead) break;
    if (!busy) oldest_deadline = absl::Now() + options_.transfer_timeout;
    if (!Serve(fd, payload, link->get()).ok()) break;
  }
  link->reset();  // aborts the communicator and drains the streams
  close(fd);
}

absl::Status NcclAgent::Serve(int fd, const std::string& payload, NcclLink* link) {
  // A request that does not parse means the peer speaks garbage: drop the connection.
  ASSIGN_OR_RETURN(nccl_wire::ReadRequest req, nccl_wire::DecodeReadRequest(payload));
  std::vector<uint64_t> region_bytes;
  {
    absl::MutexLock lock(&mu_);
    for (const Region& r : regions_) region_bytes.push_back(r.length);
  }
  nccl_wire::ReadAck ack;
  ack.id = req.id;
  ack.chunk_bytes = std::min(req.params.chunk_bytes, options_.staging_chunk_bytes);
  ack.verdict = nccl_wire::ValidateSourceRanges(req.ops, region_bytes);
  absl::StatusOr<nccl_plan::Plan> plan = absl::UnknownError("unset");
  if (ack.verdict.ok()) {
    plan = nccl_plan::MakePlan(OpShapes(req.ops), {ack.chunk_bytes, req.params.direct_min_bytes});
    ack.verdict = plan.status();
  }
  // Ack first: the reader posts its receives while we launch the sends.
  RETURN_IF_ERROR(nccl_socket::SendFrame(fd, MessageType::kReadAck, nccl_wire::EncodeReadAck(ack)));
  if (!ack.verdict.ok()) return absl::OkStatus();
  return link->Enqueue(*plan, OpPlaces(req.ops, /*local=*/false));
}

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

void NcclAgent::PeerLoop(Peer* peer) {
  std::unique_ptr<NcclLink> link;
  int fd = -1;
  absl::Status init = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(fd, nccl_socket::Connect(peer->host, peer->port, options_.connect_timeout));
    std::vector<ncclUniqueId> ids(static_cast<size_t>(options_.num_comms));
    for (ncclUniqueId& id : ids) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    // Answers the source's challenge with a proof of its access token (nccl_agent_auth.h).
    RETURN_IF_ERROR(nccl_auth::SendHello(
        fd, peer->token,
        absl::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(ids[0])),
        peer->stop, options_.init_timeout));
    ASSIGN_OR_RETURN(link, NcclLink::Connect(LinkOptions(options_), NcclLink::Role::kReceiver, ids,
                                             fd, peer->stop));
    return absl::OkStatus();
  }();
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
  const nccl_plan::PlanParams params{options_.staging_chunk_bytes, options_.direct_min_bytes};
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
    // All of them into `awaiting` first: if a send fails, the teardown ends them all.
    for (Transfer* t : fresh) awaiting.push_back({t, absl::Now() + options_.transfer_timeout});
    for (Transfer* t : fresh) {
      nccl_plan::PlanParams p = params;
      if (alone) {
        p.chunk_bytes = nccl_plan::LoneTransferChunk(t->bytes, options_.staging_chunk_bytes,
                                                     options_.lone_min_chunk_bytes);
      }
      absl::StatusOr<std::string> request = nccl_wire::EncodeReadRequest(t->id, p, t->ops);
      conn_status = request.ok() ? nccl_socket::SendFrame(fd, MessageType::kRead, *request)
                                 : request.status();
      if (!conn_status.ok()) break;
    }
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

}  // namespace tandem::kvtransfer
