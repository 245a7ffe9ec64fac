#include "common/grpc_listener.h"

#include <grpcpp/resource_quota.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/logging.h"

namespace tandem {
namespace {

int Ms(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

// The port's bounds on the builder (GrpcListenerOptions says why each).
void SetBounds(const GrpcListenerOptions& options, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, Ms(options.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(options.keepalive_timeout));
  // Idle connections too, and every keepalive_time: without these the server stops pinging
  // after 2 pings with no data sent and spaces pings without data 5 minutes apart.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
                             Ms(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             std::max(options.max_concurrent_streams, 1));
  grpc::ResourceQuota quota("tandem gRPC port");
  quota.Resize(static_cast<size_t>(std::max<int64_t>(options.memory_quota_bytes, 1 << 20)));
  builder.SetResourceQuota(quota);  // holds its own reference
}

absl::Status Unavailable(const std::string& address, const std::string& what) {
  return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", what));
}

// A listening TCP socket on `address` (HOST:PORT), or -1 with `error` set.
int ListenOn(const std::string& address, std::string* error) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "expected HOST:PORT";
    return -1;
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    *error = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  *error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
    *error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Add(
    const std::string& address, std::shared_ptr<grpc::ServerCredentials> credentials,
    grpc::ServerBuilder* builder, const GrpcListenerOptions& options) {
  std::unique_ptr<GrpcListener> listener(new GrpcListener());
  listener->max_connections_ = WithinAQuarterOfTheOpenFileLimit(options.max_connections);
  std::string error;
  listener->listen_fd_ = ListenOn(address, &error);
  if (listener->listen_fd_ < 0) return Unavailable(address, error);
  listener->port_ = BoundPort(listener->listen_fd_);
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listener->wake_fd_ < 0 || listener->port_ == 0) {
    return Unavailable(address, std::strerror(errno));
  }
  SetBounds(options, *builder);
  listener->acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
  return listener;
}

GrpcListener::~GrpcListener() {
  stopping_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void GrpcListener::Start() {
  thread_ = std::thread([this] { AcceptLoop(); });
}

void GrpcListener::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  bool backoff = false;  // after a failed accept: wait kAcceptRetry instead of spinning
  while (!stopping_.load()) {
    fds[0].events = backoff ? 0 : POLLIN;
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, backoff ? static_cast<int>(kAcceptRetry.count()) : -1) < 0 && errno != EINTR) {
      break;
    }
    if (stopping_.load() || (fds[1].revents & POLLIN)) break;
    backoff = false;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      LOG_EVERY_N(WARNING, 100) << "grpc port " << port_ << ": accept failed ("
                                << std::strerror(errno) << "); retrying in " << kAcceptRetry.count()
                                << " ms";
      backoff = true;
      continue;
    }
    Admit(fd);
  }
}

void GrpcListener::Admit(int fd) {
  if (static_cast<int>(handed_.size()) >= max_connections_ &&
      std::chrono::steady_clock::now() - last_recount_ >= kRecountInterval) {
    Recount();
  }
  struct stat st {};
  if (static_cast<int>(handed_.size()) >= max_connections_ || fstat(fd, &st) != 0) {
    LOG_EVERY_N(WARNING, 1000) << "grpc port " << port_ << ": " << handed_.size()
                               << " connections open (the cap): a new one closed";
    close(fd);
    return;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  handed_.push_back({fd, st.st_dev, st.st_ino});
  connections_.store(static_cast<int>(handed_.size()));
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
  params.listener_fd = listen_fd_;
  params.fd = fd;  // the server's from here on
  acceptor_->HandleNewConnection(&params);
}

void GrpcListener::Recount() {
  // The server closes a connection's descriptor when it ends (a failed or timed-out handshake,
  // the peer gone, GOAWAY). The number may since name another socket or file: the inode tells.
  std::erase_if(handed_, [](const Handed& h) {
    struct stat st {};
    return fstat(h.fd, &st) != 0 || st.st_dev != h.dev || st.st_ino != h.ino;
  });
  connections_.store(static_cast<int>(handed_.size()));
  last_recount_ = std::chrono::steady_clock::now();
}

}  // namespace tandem
