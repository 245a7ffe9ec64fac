#include "common/http/http_server.h"

#include <malloc.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <deque>
#include <thread>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crash_handler.h"
#include "common/http/body_budget.h"
#include "common/http/tls_context.h"
#include "nlohmann/json.hpp"

namespace tandem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// A connection's byte stream: plain TCP, or TLS over it. Session is templated on it, so the HTTP
// code below is the same for both.
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

constexpr uint32_t kHeaderLimit = 16 * 1024;
// How long a TLS connection being closed waits for the client's close_notify.
constexpr auto kTlsCloseTimeout = std::chrono::seconds(1);
// How long a refused request's unread body is drained (discarded) before the connection closes:
// closing with it unread would reset the connection, which can destroy the refusal in flight.
constexpr auto kRefusalDrainTimeout = std::chrono::seconds(2);

const char* ErrorType(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

// OpenSSL's verdict on a "handshake" that began with a plain HTTP request line.
bool IsPlainHttpOnTls(const beast::error_code& ec) {
  return ec.category() == net::error::get_ssl_category() &&
         ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST;
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
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

// What the server and a stream handle need of a connection, whatever its byte stream.
class SessionBase : public Responder {
 public:
  // Stream side, from any thread (they post onto the connection's strand).
  virtual bool Write(std::string data) = 0;
  virtual void Close() = 0;
  // Cancels an open stream and closes the connection (HttpServer's Stop).
  virtual void RequestCancel() = 0;
  bool cancelled() const { return cancelled_.load(); }
  void OnCancel(std::function<void()> fn);

 protected:
  // The OnCancel callback, once (null when none was set).
  std::function<void()> TakeOnCancel();

  std::atomic<bool> cancelled_{false}, closed_{false};

 private:
  absl::Mutex cancel_mu_;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(cancel_mu_);
};

struct HttpServer::Impl {
  HttpServerOptions options;
  std::map<std::pair<std::string, std::string>, Handler> routes;
  std::unique_ptr<net::ssl::context> tls;  // null: plain HTTP
  std::unique_ptr<BodyBudget> body_budget;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  absl::Mutex mu;
  std::vector<std::weak_ptr<SessionBase>> sessions ABSL_GUARDED_BY(mu);  // to cancel on Stop

  void Accept(std::shared_ptr<Impl> self);
  void Stop();
};

// One connection over `Stream` (PlainStream or TlsStream). Runs on its strand; ResponseStream
// calls post onto it.
template <typename Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  // `stream_args`: the accepted socket (and, for TLS, the context).
  template <typename... StreamArgs>
  explicit Session(std::shared_ptr<HttpServer::Impl> server, StreamArgs&&... stream_args)
      : stream_(std::forward<StreamArgs>(stream_args)...),
        server_(std::move(server)),
        reservation_(server_->body_budget.get()) {
    ++server_->connections;
  }
  ~Session() override {
    // The last connection gone: hand the heap's free pages back to the system (handshake and
    // parser state of many connections fragments it; glibc would otherwise keep the peak).
    if (--server_->connections == 0) net::post(server_->ioc, [] { malloc_trim(0); });
  }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Handshake();
      } else {
        self->Read();
      }
    });
  }

  // Responder (called from the handler, on the strand).
  void Reply(Response response) override;
  std::shared_ptr<ResponseStream> StartStream(
      int status, const std::string& content_type,
      std::vector<std::pair<std::string, std::string>> headers) override;

  bool Write(std::string data) override;
  void Close() override;
  void RequestCancel() override {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] {
      self->Cancel();
      self->CloseSocket();
    });
  }

 private:
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }
  void Handshake();
  void RefusePlainHttp();
  void DrainThenClose();
  void Read();
  // The read's error answered (or the connection ended); false when there was none.
  bool OnReadError(beast::error_code ec);
  void OnHeader(beast::error_code ec);
  // Admission, the body's size and the body budget; a refusal when the request may not go on.
  std::optional<Response> Admit();
  void ReadBody();
  void OnRead(beast::error_code ec);
  // The request line and headers of the request being read (no body).
  Request Head();
  void Dispatch();
  void SendSimple(Response response, bool close);
  // Sends `response` and closes without reading the request's body (drained unread).
  void Refuse(Response response);
  void BeginStream(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers);
  void WriteNext();
  void WatchForDisconnect();
  void Cancel();
  // Ends the connection: over TLS a close_notify first (unless cancelled), then CloseSocket.
  void Shutdown();
  void CloseSocket();

  Stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  BodyReservation reservation_;  // the body of the request being read
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool keep_alive_ = false;
  bool drain_on_close_ = false;  // a refused request's body is still coming
  // Streaming state (strand only, except the atomics in SessionBase).
  bool streaming_ = false, writing_ = false, closing_ = false;
  std::deque<std::string> queue_;
  std::shared_ptr<bhttp::response<bhttp::empty_body>> stream_header_;
  std::shared_ptr<bhttp::response_serializer<bhttp::empty_body>> serializer_;
  char probe_[1];
  std::optional<net::steady_timer> close_timer_;  // TLS: bounds the close_notify exchange
};

namespace {

class StreamHandle final : public ResponseStream {
 public:
  explicit StreamHandle(std::shared_ptr<SessionBase> s) : session_(std::move(s)) {}
  ~StreamHandle() override { session_->Close(); }
  bool Write(std::string data) override { return session_->Write(std::move(data)); }
  void Close() override { session_->Close(); }
  bool cancelled() const override { return session_->cancelled(); }
  void OnCancel(std::function<void()> fn) override { session_->OnCancel(std::move(fn)); }

 private:
  std::shared_ptr<SessionBase> session_;
};

}  // namespace

void SessionBase::OnCancel(std::function<void()> fn) {
  {
    absl::MutexLock lock(&cancel_mu_);
    if (!cancelled_.load()) {
      on_cancel_ = std::move(fn);
      return;
    }
  }
  fn();
}

std::function<void()> SessionBase::TakeOnCancel() {
  absl::MutexLock lock(&cancel_mu_);
  return std::move(on_cancel_);
}

template <typename Stream>
void Session<Stream>::Handshake() {
  tcp().expires_after(ToChrono(server_->options.read_timeout));
  stream_.async_handshake(net::ssl::stream_base::server,
                          [self = this->shared_from_this()](beast::error_code ec) {
                            if (!ec) {
                              self->Read();
                            } else if (IsPlainHttpOnTls(ec)) {
                              self->RefusePlainHttp();
                            } else {  // not TLS, an untrusted client certificate, a timeout
                              self->CloseSocket();
                            }
                          });
}

template <typename Stream>
void Session<Stream>::RefusePlainHttp() {
  // In plain text on the TCP stream, so that a client dialling http:// learns what went wrong.
  Response error = ErrorResponse(400, "this port speaks HTTPS: use an https:// URL");
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(bhttp::status::bad_request, 11);
  res->set(bhttp::field::server, "tandem");
  res->set(bhttp::field::content_type, error.content_type);
  res->keep_alive(false);
  res->body() = std::move(error.body);
  res->prepare_payload();
  bhttp::async_write(tcp(), *res,
                     [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
                       if (ec) return self->CloseSocket();
                       beast::error_code ignored;
                       self->tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
                       self->tcp().expires_after(kTlsCloseTimeout);
                       self->DrainThenClose();
                     });
}

template <typename Stream>
void Session<Stream>::DrainThenClose() {
  // A lingering close: closing with the rest of the request unread would send a reset, which can
  // destroy the 400 before the client reads it. Drop what comes until the client closes (or the
  // deadline the caller set passes).
  tcp().async_read_some(buffer_.prepare(4096),
                        [self = this->shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->CloseSocket();
                          self->DrainThenClose();
                        });
}

template <typename Stream>
void Session<Stream>::Read() {
  parser_.emplace();
  parser_->body_limit(server_->options.max_body_bytes);
  parser_->header_limit(kHeaderLimit);
  tcp().expires_after(ToChrono(server_->options.read_timeout));
  bhttp::async_read_header(
      stream_, buffer_, *parser_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

template <typename Stream>
bool Session<Stream>::OnReadError(beast::error_code ec) {
  if (!ec) return false;
  if (ec == bhttp::error::body_limit) {
    Refuse(ErrorResponse(
        413, absl::StrCat("request body over ", server_->options.max_body_bytes, " bytes")));
  } else if (ec == bhttp::error::header_limit) {
    SendSimple(ErrorResponse(431, "request headers too large"), true);
  } else if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    SendSimple(ErrorResponse(400, absl::StrCat("malformed HTTP request: ", ec.message())), true);
  } else {
    Shutdown();  // closed, timed out, reset
  }
  return true;
}

template <typename Stream>
void Session<Stream>::OnHeader(beast::error_code ec) {
  if (OnReadError(ec)) return;
  if (std::optional<Response> refusal = Admit()) {
    Refuse(*std::move(refusal));
    return;
  }
  const auto& msg = parser_->get();
  if (!parser_->is_done() && beast::iequals(msg[bhttp::field::expect], "100-continue")) {
    auto go_on = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, 11);
    bhttp::async_write(stream_, *go_on,
                       [self = this->shared_from_this(), go_on](beast::error_code ec, size_t) {
                         if (ec) return self->Shutdown();
                         self->ReadBody();
                       });
    return;
  }
  ReadBody();
}

template <typename Stream>
std::optional<Response> Session<Stream>::Admit() {
  const HttpServerOptions& options = server_->options;
  if (options.admission) {
    if (std::optional<Response> refusal = options.admission(Head())) return refusal;
  }
  uint64_t body_bytes = 0;
  if (parser_->chunked()) {
    body_bytes = options.max_body_bytes;  // the most it may grow to
  } else if (const auto length = parser_->content_length(); length.has_value()) {
    body_bytes = *length;  // within max_body_bytes: the parser refused the headers otherwise
  }
  if (!reservation_.Reserve(body_bytes)) {
    Response busy = ErrorResponse(
        503, absl::StrCat("the server holds its limit of ", options.max_buffered_body_bytes,
                          " bytes of request bodies; retry later"));
    busy.headers.emplace_back("Retry-After", "1");
    return busy;
  }
  return std::nullopt;
}

template <typename Stream>
void Session<Stream>::ReadBody() {
  tcp().expires_after(ToChrono(server_->options.read_timeout));
  bhttp::async_read(
      stream_, buffer_, *parser_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

template <typename Stream>
void Session<Stream>::OnRead(beast::error_code ec) {
  if (OnReadError(ec)) return;
  Dispatch();
}

template <typename Stream>
Request Session<Stream>::Head() {
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
  beast::error_code ignored;
  const auto endpoint = tcp().socket().remote_endpoint(ignored);
  req.peer = absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
  return req;
}

template <typename Stream>
void Session<Stream>::Dispatch() {
  keep_alive_ = parser_->get().keep_alive();
  {
    Request req = Head();
    req.body = std::move(parser_->get().body());
    parser_.reset();
    auto it = server_->routes.find({req.method, req.path});
    if (it != server_->routes.end()) {
      it->second(req, this->shared_from_this());
    } else {
      bool path_known = false;
      for (const auto& [key, handler] : server_->routes) path_known |= key.second == req.path;
      SendSimple(path_known ? ErrorResponse(405, absl::StrCat("method ", req.method,
                                                              " not allowed on ", req.path))
                            : ErrorResponse(404, absl::StrCat("no route for ", req.path)),
                 !keep_alive_);
    }
  }  // the body is freed here: handlers copy what they keep
  reservation_.Release();
  buffer_.shrink_to_fit();
}

template <typename Stream>
void Session<Stream>::Reply(Response response) {
  net::dispatch(stream_.get_executor(),
                [self = this->shared_from_this(), r = std::move(response)]() mutable {
                  self->SendSimple(std::move(r), !self->keep_alive_);
                });
}

template <typename Stream>
void Session<Stream>::SendSimple(Response response, bool close) {
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
      static_cast<bhttp::status>(response.status), 11);
  res->set(bhttp::field::server, "tandem");
  res->set(bhttp::field::content_type, response.content_type);
  for (const auto& [k, v] : response.headers) res->set(k, v);
  res->keep_alive(!close);
  res->body() = std::move(response.body);
  res->prepare_payload();
  bhttp::async_write(stream_, *res,
                     [self = this->shared_from_this(), res, close](beast::error_code ec, size_t) {
                       if (!ec && close && self->drain_on_close_) {
                         beast::error_code ignored;
                         self->tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
                         self->tcp().expires_after(kRefusalDrainTimeout);
                         self->DrainThenClose();
                       } else if (ec || close) {
                         self->Shutdown();
                       } else {
                         self->Read();
                       }
                     });
}

template <typename Stream>
void Session<Stream>::Refuse(Response response) {
  reservation_.Release();
  parser_.reset();
  drain_on_close_ = true;
  SendSimple(std::move(response), /*close=*/true);
}

template <typename Stream>
std::shared_ptr<ResponseStream> Session<Stream>::StartStream(
    int status, const std::string& content_type,
    std::vector<std::pair<std::string, std::string>> headers) {
  net::dispatch(stream_.get_executor(), [self = this->shared_from_this(), status, content_type,
                                         headers = std::move(headers)] {
    self->BeginStream(status, content_type, headers);
  });
  return std::make_shared<StreamHandle>(this->shared_from_this());
}

template <typename Stream>
void Session<Stream>::BeginStream(int status, const std::string& content_type,
                                  const std::vector<std::pair<std::string, std::string>>& headers) {
  streaming_ = true;
  tcp().expires_never();
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
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              if (ec) {
                                self->Cancel();
                                return;
                              }
                              self->WatchForDisconnect();
                              self->WriteNext();
                            });
}

template <typename Stream>
void Session<Stream>::WatchForDisconnect() {
  // A streaming client sends nothing; a completed read means it closed (or misbehaves). Over TLS
  // this read runs alongside the chunk writes (one read and one write at a time is allowed).
  stream_.async_read_some(net::buffer(probe_),
                          [self = this->shared_from_this()](beast::error_code ec, size_t) {
                            if (ec && !self->closed_.load()) self->Cancel();
                          });
}

template <typename Stream>
bool Session<Stream>::Write(std::string data) {
  if (cancelled_.load() || closed_.load()) return false;
  net::post(stream_.get_executor(),
            [self = this->shared_from_this(), d = std::move(data)]() mutable {
              if (self->cancelled_.load() || self->closing_) return;
              self->queue_.push_back(std::move(d));
              self->WriteNext();
            });
  return true;
}

template <typename Stream>
void Session<Stream>::Close() {
  if (closed_.exchange(true)) return;
  net::post(stream_.get_executor(), [self = this->shared_from_this()] {
    self->closing_ = true;
    self->WriteNext();
  });
}

template <typename Stream>
void Session<Stream>::WriteNext() {
  if (writing_ || cancelled_.load() || !streaming_) return;
  if (!queue_.empty()) {
    auto data = std::make_shared<std::string>(std::move(queue_.front()));
    queue_.pop_front();
    writing_ = true;
    net::async_write(stream_, bhttp::make_chunk(net::buffer(*data)),
                     [self = this->shared_from_this(), data](beast::error_code ec, size_t) {
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
                     [self = this->shared_from_this()](beast::error_code, size_t) {
                       self->writing_ = false;
                       self->Shutdown();  // one streamed response per connection
                     });
  }
}

template <typename Stream>
void Session<Stream>::Cancel() {
  if (closed_.load() && !streaming_) return;
  if (cancelled_.exchange(true)) return;
  if (std::function<void()> fn = TakeOnCancel()) fn();
  Shutdown();
}

template <typename Stream>
void Session<Stream>::Shutdown() {
  if constexpr (kTls) {
    // close_notify lets the client tell the end of the connection from a truncation. A client
    // that does not answer it (or keeps the connection pooled) is cut off after kTlsCloseTimeout.
    if (!cancelled_.load() && !close_timer_) {
      close_timer_.emplace(stream_.get_executor(), kTlsCloseTimeout);
      close_timer_->async_wait(
          [self = this->shared_from_this()](beast::error_code) { self->CloseSocket(); });
      stream_.async_shutdown(
          [self = this->shared_from_this()](beast::error_code) { self->CloseSocket(); });
      return;
    }
  }
  CloseSocket();
}

template <typename Stream>
void Session<Stream>::CloseSocket() {
  if (close_timer_) close_timer_->cancel();
  beast::error_code ignored;
  tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
  tcp().socket().close(ignored);
}

void HttpServer::Impl::Accept(std::shared_ptr<Impl> self) {
  acceptor.async_accept(
      net::make_strand(ioc), [this, self](beast::error_code ec, tcp::socket socket) {
        if (ec || stopping.load()) return;
        if (connections.load() >= options.max_connections) {
          beast::error_code ignored;
          socket.close(ignored);
        } else {
          std::shared_ptr<SessionBase> session;
          if (tls != nullptr) {
            auto tls_session = std::make_shared<Session<TlsStream>>(self, std::move(socket), *tls);
            tls_session->Start();
            session = std::move(tls_session);
          } else {
            auto plain_session = std::make_shared<Session<PlainStream>>(self, std::move(socket));
            plain_session->Start();
            session = std::move(plain_session);
          }
          absl::MutexLock lock(&mu);
          sessions.erase(std::remove_if(sessions.begin(), sessions.end(),
                                        [](const auto& w) { return w.expired(); }),
                         sessions.end());
          sessions.push_back(std::move(session));
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
  std::vector<std::shared_ptr<SessionBase>> live;
  {
    absl::MutexLock lock(&mu);
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
  impl->body_budget = std::make_unique<BodyBudget>(options.max_buffered_body_bytes);
  if (options.tls.has_value()) {
    absl::StatusOr<std::unique_ptr<net::ssl::context>> tls = MakeServerTlsContext(*options.tls);
    if (!tls.ok()) return tls.status();
    impl->tls = *std::move(tls);
  }
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
    impl->threads.emplace_back([impl_raw = impl.get()] {
      UseAlternateSignalStack();  // handlers parse what clients send: a trace even on overflow
      impl_raw->ioc.run();
    });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(impl));
}

HttpServer::~HttpServer() { impl_->Stop(); }

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

int HttpServer::connections() const { return impl_->connections.load(); }

}  // namespace tandem::http
