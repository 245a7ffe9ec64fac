#include "common/http/http_session.h"

#include <malloc.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"

namespace tandem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// OpenSSL's verdict on a "handshake" that began with a plain HTTP request line.
bool IsPlainHttpOnTls(const beast::error_code& ec) {
  return ec.category() == net::error::get_ssl_category() &&
         ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST;
}

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
Session<Stream>::~Session() {
  // The last connection gone: hand the heap's free pages back to the system (handshake and
  // parser state of many connections fragments it; glibc would otherwise keep the peak).
  if (--server_->connections == 0) net::post(server_->ioc, [] { malloc_trim(0); });
}

template <typename Stream>
void Session<Stream>::Start() {
  net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
    if constexpr (kTls) {
      self->Handshake();
    } else {
      self->Read();
    }
  });
}

template <typename Stream>
void Session<Stream>::RequestCancel() {
  net::post(stream_.get_executor(), [self = this->shared_from_this()] {
    self->Cancel();
    self->CloseSocket();
  });
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
  ArmReadTimer();
  bhttp::async_read_header(
      stream_, buffer_, *parser_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

template <typename Stream>
void Session<Stream>::ArmReadTimer() {
  const auto timeout = ToChrono(server_->options.read_timeout);
  tcp().expires_after(timeout + kReadTimeoutSlack);
  reading_ = true;
  read_timed_out_ = false;
  read_timer_.emplace(stream_.get_executor(), timeout);
  read_timer_->async_wait([self = this->shared_from_this()](beast::error_code ec) {
    if (ec || !self->reading_) return;
    self->read_timed_out_ = true;
    self->tcp().cancel();  // the read ends with operation_aborted; its handler answers 408
  });
}

template <typename Stream>
bool Session<Stream>::ReadTimedOut() {
  reading_ = false;
  if (read_timer_) read_timer_->cancel();
  return read_timed_out_;
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
  if (ReadTimedOut()) {
    // A request begun and stalled in its line or headers is told why it is cut off; an idle
    // connection (not a byte of a next request) just closes.
    if (!parser_->got_some() && buffer_.size() == 0) return Shutdown();
    return Refuse(
        ErrorResponse(408, absl::StrCat("the request line and headers did not arrive within ",
                                        absl::FormatDuration(server_->options.read_timeout))));
  }
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
  // A body shorter than its Content-Length (or a stalled chunked one) gets a 408 from our timer;
  // Beast's timeout, later, only backs it up (it closes the socket without a word).
  ArmReadTimer();
  bhttp::async_read(
      stream_, buffer_, *parser_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

template <typename Stream>
void Session<Stream>::OnRead(beast::error_code ec) {
  if (ReadTimedOut()) {
    Refuse(ErrorResponse(408, absl::StrCat("the request body did not arrive within ",
                                           absl::FormatDuration(server_->options.read_timeout),
                                           " (shorter than its Content-Length?)")));
    return;
  }
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
  http10_ = parser_->get().version() < 11;
  awaiting_reply_ = true;  // until SendSimple or BeginStream (either may run inside the handler)
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
  // Not answered yet (the work behind it runs elsewhere): see the client leave meanwhile. With a
  // pipelined request already buffered there is nothing to watch for.
  if (awaiting_reply_ && !streaming_ && buffer_.size() == 0) WatchBeforeReply();
}

template <typename Stream>
void Session<Stream>::WatchBeforeReply() {
  watching_ = true;
  tcp().expires_never();  // a long generation is not a slow client
  stream_.async_read_some(
      buffer_.prepare(kWatchBytes),
      [self = this->shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
}

template <typename Stream>
void Session<Stream>::OnWatch(beast::error_code ec, size_t bytes) {
  watching_ = false;
  if (idle_timer_) idle_timer_->cancel();
  if (streaming_) {  // the answer became a stream meanwhile: this read is its disconnect watch
    if (ec && !closed_.load()) Cancel();
    return;
  }
  if (!ec) {
    buffer_.commit(bytes);         // the next request's first bytes
    if (!awaiting_reply_) Read();  // else the answer's write reads it when done
    return;
  }
  if (awaiting_reply_ && !cancelled_.exchange(true)) {  // the client left before its answer
    if (std::function<void()> fn = TakeOnCancel()) fn();
  }
  CloseSocket();
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
  awaiting_reply_ = false;
  if (cancelled_.load()) return;  // the client left: nobody to answer
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
                         // A pending watch read rules out TLS's close_notify exchange (a second
                         // read): the answer is whole (Content-Length), so just close.
                         self->watching_ ? self->CloseSocket() : self->Shutdown();
                       } else if (self->watching_) {  // its read is the next request's first
                         self->idle_timer_.emplace(self->stream_.get_executor(),
                                                   ToChrono(self->server_->options.read_timeout));
                         self->idle_timer_->async_wait([self](beast::error_code wait_ec) {
                           if (!wait_ec && self->watching_) self->CloseSocket();
                         });
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

// What http_server.cc (Accept, the vtable) and http_session_stream.cc call, for both streams.
template Session<PlainStream>::~Session();
template void Session<PlainStream>::Start();
template void Session<PlainStream>::Reply(Response);
template void Session<PlainStream>::RequestCancel();
template void Session<PlainStream>::Shutdown();
template Session<TlsStream>::~Session();
template void Session<TlsStream>::Start();
template void Session<TlsStream>::Reply(Response);
template void Session<TlsStream>::RequestCancel();
template void Session<TlsStream>::Shutdown();

}  // namespace tandem::http
