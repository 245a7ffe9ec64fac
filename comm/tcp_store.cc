#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "tandem/v1/limits.h"

namespace tandem::comm {
namespace {

using tandem::v1::StoreRequest;
using tandem::v1::StoreResponse;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("store: deadline passed");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return Errno("poll");
  }
}

absl::Status WriteAll(int fd, const char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("store send");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLIN, deadline); !s.ok()) return s;
    const ssize_t n = recv(fd, data, size, 0);
    if (n == 0) return absl::UnavailableError("store: connection closed by the peer");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("store recv");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteMessage(int fd, const google::protobuf::Message& message, absl::Time deadline) {
  std::string bytes;
  message.SerializeToString(&bytes);
  if (bytes.size() > static_cast<size_t>(tandem::v1::kMaxStoreMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("store message of ", bytes.size(), " bytes"));
  }
  char header[4];
  for (int i = 0; i < 4; ++i) header[i] = static_cast<char>(bytes.size() >> (8 * i));
  if (absl::Status s = WriteAll(fd, header, 4, deadline); !s.ok()) return s;
  return WriteAll(fd, bytes.data(), bytes.size(), deadline);
}

absl::Status ReadMessage(int fd, google::protobuf::Message* message, absl::Time deadline) {
  unsigned char header[4];
  if (absl::Status s = ReadAll(fd, reinterpret_cast<char*>(header), 4, deadline); !s.ok()) {
    return s;
  }
  const uint32_t size =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (size > static_cast<uint32_t>(tandem::v1::kMaxStoreMessageBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("store frame of ", size, " bytes refused"));
  }
  std::string bytes(size, '\0');
  if (absl::Status s = ReadAll(fd, bytes.data(), size, deadline); !s.ok()) return s;
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError("store: malformed message");
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("store: cannot resolve host '", host, "'"));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(result->ai_addr);
  freeaddrinfo(result);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                      int port) {
  absl::StatusOr<sockaddr_in> addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("store socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0 || listen(fd, 128) != 0) {
    absl::Status s = Errno(absl::StrCat("store: cannot listen on ", host, ":", port));
    close(fd);
    return s;
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  auto server = std::unique_ptr<TcpStoreServer>(new TcpStoreServer());
  server->listen_fd_ = fd;
  server->port_ = ntohs(bound.sin_port);
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);  // wakes their threads
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu_);
  for (int fd : fds_) close(fd);
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    absl::MutexLock lock(&mu_);
    if (stop_) {
      close(fd);
      return;
    }
    fds_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  while (!stop_) {
    StoreRequest request;
    // A client may stay idle between calls for as long as its group lives.
    absl::Status read = ReadMessage(fd, &request, absl::InfiniteFuture());
    if (!read.ok()) return;  // closed, or garbage: drop the connection
    const StoreResponse response = Handle(request);
    if (!WriteMessage(fd, response, absl::Now() + absl::Seconds(30)).ok()) return;
  }
}

StoreResponse TcpStoreServer::Handle(const StoreRequest& request) {
  StoreResponse response;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  switch (request.op()) {
    case StoreRequest::OP_SET:
      values_[request.key()] = request.value();
      break;
    case StoreRequest::OP_GET: {
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || values_.contains(request.key());
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline) || stop_) {
        response.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
        response.set_message(absl::StrCat("store: key '", request.key(), "' not set in time"));
        break;
      }
      response.set_value(values_[request.key()]);
      break;
    }
    case StoreRequest::OP_WAIT: {
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stop_) return true;
        for (const std::string& k : request.keys()) {
          if (!values_.contains(k)) return false;
        }
        return true;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline) || stop_) {
        response.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
        response.set_message("store: keys not set in time");
      }
      break;
    }
    default:
      response.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      response.set_message("store: unknown op");
  }
  return response;
}

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host,
                                                                        int port,
                                                                        absl::Duration timeout) {
  absl::StatusOr<sockaddr_in> addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("store: not tried");
  while (absl::Now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("store socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(fd));
    }
    last = Errno(absl::StrCat("store: connect to ", host, ":", port));
    close(fd);
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(last.message(), " (gave up after ", absl::FormatDuration(timeout), ")"));
}

TcpStoreClient::~TcpStoreClient() { close(fd_); }

absl::StatusOr<StoreResponse> TcpStoreClient::Call(const StoreRequest& request,
                                                   absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  // The server answers by the request's own timeout; allow it a moment to reply.
  const absl::Time deadline = absl::Now() + timeout + absl::Seconds(2);
  if (absl::Status s = WriteMessage(fd_, request, deadline); !s.ok()) return s;
  StoreResponse response;
  if (absl::Status s = ReadMessage(fd_, &response, deadline); !s.ok()) return s;
  if (response.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
  }
  return response;
}

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value,
                                 absl::Duration timeout) {
  StoreRequest request;
  request.set_op(StoreRequest::OP_SET);
  request.set_key(key);
  request.set_value(value);
  return Call(request, timeout).status();
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, absl::Duration timeout) {
  StoreRequest request;
  request.set_op(StoreRequest::OP_GET);
  request.set_key(key);
  request.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  absl::StatusOr<StoreResponse> response = Call(request, timeout);
  if (!response.ok()) return response.status();
  return response->value();
}

absl::Status TcpStoreClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  StoreRequest request;
  request.set_op(StoreRequest::OP_WAIT);
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  return Call(request, timeout).status();
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = client_->Set(prefix_ + key, std::string(data.begin(), data.end()), timeout_);
  if (!s.ok()) GLOO_THROW_IO_EXCEPTION(s.ToString());
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = client_->Get(prefix_ + key, timeout_);
  if (!v.ok()) GLOO_THROW_IO_EXCEPTION(v.status().ToString());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  for (const std::string& k : keys) full.push_back(prefix_ + k);
  absl::Status s = client_->Wait(full, absl::Milliseconds(timeout.count()));
  if (!s.ok()) GLOO_THROW_IO_EXCEPTION(s.ToString());
}

}  // namespace tandem::comm
