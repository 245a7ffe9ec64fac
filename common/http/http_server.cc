#include "common/http/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace tandem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr uint32_t kHeaderLimit = 16 * 1024;

const char* ErrorType(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

}  // namespace

std::string Request::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

Response ErrorResponse(int status, const std::string& message, const std::string& type) {
  nlohmann::json body = {{"error",
                          {{"message", message},
                           {"type", type.empty() ? ErrorType(status) : type},
                           {"code", status}}}};
  Response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

class Session;

struct HttpServer::Impl {
  HttpServerOptions options;
  std::map<std::pair<std::string, std::string>, Handler> routes;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::vector<std::weak_ptr<Session>> sessions;  // to cancel their streams on Stop

  void Accept(std::shared_ptr<Impl> self);
  void Stop();
};

// One connection. Runs on its strand; ResponseStream calls post onto it.
class Session : public std::enable_shared_from_this<Session>, public Responder {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {
    ++server_->connections;
  }
  ~Session() override { --server_->connections; }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

  // Responder (called from the handler, on the strand).
  void Reply(Response response) override;
  std::shared_ptr<ResponseStream> StartStream(
      int status, const std::string& content_type,
      std::vector<std::pair<std::string, std::string>> headers) override;

  void BeginStream(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers);
  // Stream side (posted onto the strand).
  bool Write(std::string data);
  void Close();
  void Cancel();
  void RequestCancel() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Cancel(); });
  }
  bool cancelled() const { return cancelled_.load(); }
  void OnCancel(std::function<void()> fn);

 private:
  void Read();
  void OnRead(beast::error_code ec);
  void Dispatch();
  void SendSimple(Response response, bool close);
  void WriteNext();
  void WatchForDisconnect();
  void Shutdown();

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool keep_alive_ = false;
  // Streaming state (strand only, except the atomics / cancel_mu_).
  bool streaming_ = false, writing_ = false, closing_ = false;
  std::deque<std::string> queue_;
  std::shared_ptr<bhttp::response<bhttp::empty_body>> stream_header_;
  std::shared_ptr<bhttp::response_serializer<bhttp::empty_body>> serializer_;
  std::atomic<bool> cancelled_{false}, closed_{false};
  std::mutex cancel_mu_;
  std::function<void()> on_cancel_;
  char probe_[1];
};

namespace {

class StreamHandle final : public ResponseStream {
 public:
  explicit StreamHandle(std::shared_ptr<Session> s) : session_(std::move(s)) {}
  ~StreamHandle() override { session_->Close(); }
  bool Write(std::string data) override { return session_->Write(std::move(data)); }
  void Close() override { session_->Close(); }
  bool cancelled() const override { return session_->cancelled(); }
  void OnCancel(std::function<void()> fn) override { session_->OnCancel(std::move(fn)); }

 private:
  std::shared_ptr<Session> session_;
};

}  // namespace

void Session::Read() {
  parser_.emplace();
  parser_->body_limit(server_->options.max_body_bytes);
  parser_->header_limit(kHeaderLimit);
  stream_.expires_after(
      std::chrono::milliseconds(absl::ToInt64Milliseconds(server_->options.read_timeout)));
  bhttp::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

void Session::OnRead(beast::error_code ec) {
  if (ec == bhttp::error::body_limit) {
    SendSimple(ErrorResponse(413, absl::StrCat("request body over ",
                                               server_->options.max_body_bytes, " bytes")),
               true);
    return;
  }
  if (ec == bhttp::error::header_limit) {
    SendSimple(ErrorResponse(431, "request headers too large"), true);
    return;
  }
  if (ec) {
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      SendSimple(ErrorResponse(400, absl::StrCat("malformed HTTP request: ", ec.message())), true);
      return;
    }
    Shutdown();  // closed, timed out, reset
    return;
  }
  Dispatch();
}

void Session::Dispatch() {
  const auto& msg = parser_->get();
  Request req;
  req.method = std::string(msg.method_string());
  const std::string target(msg.target());
  const size_t q = target.find('?');
  req.path = target.substr(0, q);
  if (q != std::string::npos) req.query = target.substr(q + 1);
  for (const auto& field : msg) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    req.headers[name] = std::string(field.value());
  }
  req.body = msg.body();
  beast::error_code ignored;
  const auto endpoint = stream_.socket().remote_endpoint(ignored);
  req.peer = absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
  keep_alive_ = msg.keep_alive();
  auto it = server_->routes.find({req.method, req.path});
  if (it == server_->routes.end()) {
    bool path_known = false;
    for (const auto& [key, handler] : server_->routes) path_known |= key.second == req.path;
    SendSimple(path_known ? ErrorResponse(405, absl::StrCat("method ", req.method,
                                                            " not allowed on ", req.path))
                          : ErrorResponse(404, absl::StrCat("no route for ", req.path)),
               !keep_alive_);
    return;
  }
  it->second(req, shared_from_this());
}

void Session::Reply(Response response) {
  net::dispatch(stream_.get_executor(),
                [self = shared_from_this(), r = std::move(response)]() mutable {
                  self->SendSimple(std::move(r), !self->keep_alive_);
                });
}

void Session::SendSimple(Response response, bool close) {
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
      static_cast<bhttp::status>(response.status), 11);
  res->set(bhttp::field::server, "tandem");
  res->set(bhttp::field::content_type, response.content_type);
  for (const auto& [k, v] : response.headers) res->set(k, v);
  res->keep_alive(!close);
  res->body() = std::move(response.body);
  res->prepare_payload();
  bhttp::async_write(stream_, *res,
                     [self = shared_from_this(), res, close](beast::error_code ec, size_t) {
                       if (ec || close) {
                         self->Shutdown();
                       } else {
                         self->Read();
                       }
                     });
}

std::shared_ptr<ResponseStream> Session::StartStream(
    int status, const std::string& content_type,
    std::vector<std::pair<std::string, std::string>> headers) {
  net::dispatch(stream_.get_executor(),
                [self = shared_from_this(), status, content_type, headers = std::move(headers)] {
                  self->BeginStream(status, content_type, headers);
                });
  return std::make_shared<StreamHandle>(shared_from_this());
}

void Session::BeginStream(int status, const std::string& content_type,
                          const std::vector<std::pair<std::string, std::string>>& headers) {
  streaming_ = true;
  stream_.expires_never();
  stream_header_ =
      std::make_shared<bhttp::response<bhttp::empty_body>>(static_cast<bhttp::status>(status), 11);
  stream_header_->set(bhttp::field::server, "tandem");
  stream_header_->set(bhttp::field::content_type, content_type);
  stream_header_->set(bhttp::field::cache_control, "no-cache");
  for (const auto& [k, v] : headers) stream_header_->set(k, v);
  stream_header_->chunked(true);
  stream_header_->keep_alive(keep_alive_);
  serializer_ = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*stream_header_);
  writing_ = true;
  bhttp::async_write_header(stream_, *serializer_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              if (ec) {
                                self->Cancel();
                                return;
                              }
                              self->WatchForDisconnect();
                              self->WriteNext();
                            });
}

void Session::WatchForDisconnect() {
  // A streaming client sends nothing; a completed read means it closed (or misbehaves).
  stream_.async_read_some(net::buffer(probe_),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec && !self->closed_.load()) self->Cancel();
                          });
}

bool Session::Write(std::string data) {
  if (cancelled_.load() || closed_.load()) return false;
  net::post(stream_.get_executor(), [self = shared_from_this(), d = std::move(data)]() mutable {
    if (self->cancelled_.load() || self->closing_) return;
    self->queue_.push_back(std::move(d));
    self->WriteNext();
  });
  return true;
}

void Session::Close() {
  if (closed_.exchange(true)) return;
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    self->closing_ = true;
    self->WriteNext();
  });
}

void Session::WriteNext() {
  if (writing_ || cancelled_.load() || !streaming_) return;
  if (!queue_.empty()) {
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    writing_ = true;
    net::async_write(stream_, bhttp::make_chunk(net::buffer(*data)),
                     [self = shared_from_this(), data](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) {
                         self->Cancel();
                         return;
                       }
                       self->WriteNext();
                     });
    return;
  }
  if (closing_) {
    streaming_ = false;
    writing_ = true;
    net::async_write(stream_, bhttp::make_chunk_last(),
                     [self = shared_from_this()](beast::error_code, size_t) {
                       self->writing_ = false;
                       self->Shutdown();  // one streamed response per connection
                     });
  }
}

void Session::Cancel() {
  if (closed_.load() && !streaming_) return;
  if (cancelled_.exchange(true)) return;
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    fn = std::move(on_cancel_);
  }
  if (fn) fn();
  Shutdown();
}

void Session::OnCancel(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    if (!cancelled_.load()) {
      on_cancel_ = std::move(fn);
      return;
    }
  }
  fn();
}

void Session::Shutdown() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

void HttpServer::Impl::Accept(std::shared_ptr<Impl> self) {
  acceptor.async_accept(
      net::make_strand(ioc), [this, self](beast::error_code ec, tcp::socket socket) {
        if (ec || stopping.load()) return;
        if (connections.load() >= options.max_connections) {
          beast::error_code ignored;
          socket.close(ignored);
        } else {
          auto session = std::make_shared<Session>(std::move(socket), self);
          {
            std::lock_guard<std::mutex> lock(mu);
            sessions.erase(std::remove_if(sessions.begin(), sessions.end(),
                                          [](const auto& w) { return w.expired(); }),
                           sessions.end());
            sessions.push_back(session);
          }
          session->Start();
        }
        Accept(self);
      });
}

void HttpServer::Impl::Stop() {
  if (stopping.exchange(true)) return;
  net::post(ioc, [this] {
    beast::error_code ignored;
    acceptor.close(ignored);
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& w : sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->RequestCancel();
  live.clear();
  // Closed sockets end the pending operations, which release their sessions; a session a caller
  // still holds (an open stream) keeps its count until it is dropped.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (connections.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ioc.stop();
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options,
    std::map<std::pair<std::string, std::string>, Handler> routes) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->routes = std::move(routes);
  beast::error_code ec;
  const auto address = net::ip::make_address(options.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: '", options.address, "' is not an IP address"));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address, ":",
                                               options.port, ": ", ec.message()));
  }
  impl->Accept(impl);
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl->threads.emplace_back([impl_raw = impl.get()] { impl_raw->ioc.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(impl));
}

HttpServer::~HttpServer() { impl_->Stop(); }

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

int HttpServer::connections() const { return impl_->connections.load(); }

}  // namespace tandem::http
