#include "kvtransfer/nccl/nccl_agent_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kvtransfer::nccl_socket {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("nccl control socket: ", what, ": ", std::strerror(errno)));
}

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("nccl control socket: cannot resolve ", host));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

absl::Status RecvAll(int fd, char* data, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, data, n, 0);
    if (r == 0) return absl::UnavailableError("nccl control socket: peer closed the connection");
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("recv");
    }
    data += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> Listen(const std::string& host, int port, int* bound_port) {
  auto addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0 || listen(fd, 64) != 0) {
    absl::Status s = Errno(absl::StrCat("bind/listen ", host, ":", port));
    close(fd);
    return s;
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  *bound_port = ntohs(bound.sin_port);
  return fd;
}

absl::StatusOr<int> Connect(const std::string& host, int port, absl::Duration timeout) {
  auto addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket");
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
      rc = 0;
    } else {
      errno = rc == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
      rc = -1;
    }
  }
  if (rc != 0) {
    absl::Status s = Errno(absl::StrCat("connect ", host, ":", port));
    close(fd);
    return s;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

absl::Status SendFrame(int fd, nccl_wire::MessageType type, absl::string_view payload) {
  std::string frame = nccl_wire::EncodeHeader(type, static_cast<uint32_t>(payload.size()));
  frame.append(payload.data(), payload.size());
  const char* data = frame.data();
  size_t n = frame.size();
  while (n > 0) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status WaitReadable(int fd, const std::atomic<bool>& stop, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (stop.load()) return absl::CancelledError("nccl control socket: stopped");
    // Wake at least every 5 ms to look at `stop`; a zero timeout polls once without sleeping.
    const absl::Duration left = deadline - absl::Now();
    const int ms =
        left <= absl::ZeroDuration()
            ? 0
            : static_cast<int>(std::min<int64_t>(5, absl::ToInt64Milliseconds(left) + 1));
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) return Errno("poll");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("nccl control socket: peer did not answer in time");
    }
  }
}

absl::Status RecvFrame(int fd, const std::atomic<bool>& stop, absl::Duration timeout,
                       nccl_wire::MessageType* type, std::string* payload, uint32_t max_payload) {
  if (absl::Status s = WaitReadable(fd, stop, timeout); !s.ok()) return s;
  char header[nccl_wire::kFrameHeaderBytes];
  if (absl::Status s = RecvAll(fd, header, sizeof(header)); !s.ok()) return s;
  uint32_t bytes = 0;
  if (absl::Status s =
          nccl_wire::DecodeHeader(absl::string_view(header, sizeof(header)), type, &bytes);
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat("nccl control socket: ", s.message()));
  }
  if (bytes > max_payload) {
    return absl::UnavailableError(absl::StrCat("nccl control socket: a frame of ", bytes,
                                               " bytes, at most ", max_payload, " expected"));
  }
  payload->resize(bytes);
  return RecvAll(fd, payload->data(), bytes);
}

absl::Status CheckAlive(int fd) {
  pollfd p{fd, POLLIN, 0};
  int rc = poll(&p, 1, 0);
  if (rc == 0) return absl::OkStatus();
  if (rc < 0) return errno == EINTR ? absl::OkStatus() : Errno("poll");
  char c;
  ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return absl::UnavailableError("nccl control socket: peer closed the connection");
  if (r < 0) {
    if (errno == EAGAIN || errno == EINTR) return absl::OkStatus();
    return Errno("recv");
  }
  return absl::InternalError("nccl control socket: unexpected bytes from the peer");
}

absl::Status CheckOpen(int fd) {
  char c;
  ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return absl::UnavailableError("nccl control socket: peer closed the connection");
  if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Errno("recv");
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::nccl_socket
