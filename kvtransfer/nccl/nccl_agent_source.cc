// The source side: the accept loop, and one thread per reader it serves (rank 1 of the reader's
// communicators), answering kReads and putting their sends on the GPU.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kvtransfer/nccl/nccl_agent.h"
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

// The source keeps at most this many transfers of one reader on the GPU; more kReads wait.
constexpr size_t kMaxServedInFlight = 16;

}  // namespace

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

}  // namespace tandem::kvtransfer
