// Session<Stream>: one HTTP/1.1 connection of HttpServer (http_server.h), and the server's shared
// state (HttpServer::Impl) it holds. Private to :http_server; http_server.cc accepts connections
// and starts a Session on each.
//
// A Session runs on its own strand. Over TLS it handshakes first; then it reads a request's line
// and headers, admits it (admission, body size, body budget), reads its body and dispatches it to
// its route's handler (http_session.cc). The handler answers through the Responder interface:
// one response (Reply), or a chunked stream (StartStream, then ResponseStream calls from any
// thread, posted onto the strand: http_session_stream.cc). Session is templated on its byte
// stream (PlainStream or TlsStream), so the HTTP code is the same for both; each .cc file
// explicitly instantiates, for both streams, the members that the other files call.
#ifndef TANDEM_COMMON_HTTP_HTTP_SESSION_H_
#define TANDEM_COMMON_HTTP_HTTP_SESSION_H_

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// After <utility>: Boost.Asio 1.74's awaitable.hpp uses std::exchange without including it.
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/body_budget.h"
#include "common/http/http_server.h"

namespace tandem::http {

// A connection's byte stream: plain TCP, or TLS over it.
using PlainStream = boost::beast::tcp_stream;
using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;

inline constexpr uint32_t kHeaderLimit = 16 * 1024;
// How long a TLS connection being closed waits for the client's close_notify.
inline constexpr auto kTlsCloseTimeout = std::chrono::seconds(1);
// How long a refused request's unread body is drained (discarded) before the connection closes:
// closing with it unread would reset the connection, which can destroy the refusal in flight.
inline constexpr auto kRefusalDrainTimeout = std::chrono::seconds(2);
// How much longer Beast's own timeout on a request's read (its head, its body) runs than ours
// (read_timeout): ours fires first and answers 408; Beast's would close the socket before we
// could write.
inline constexpr auto kReadTimeoutSlack = std::chrono::seconds(5);
// What WatchBeforeReply reads at most (the start of a pipelined next request, kept for it).
inline constexpr size_t kWatchBytes = 4096;
// How long the acceptor waits after a failed accept (EMFILE, ENFILE, ENOBUFS) before the next.
inline constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

inline std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
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
  void OnCancel(std::function<void()> fn) override;

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
  std::unique_ptr<boost::asio::ssl::context> tls;  // null: plain HTTP
  std::unique_ptr<BodyBudget> body_budget;
  boost::asio::io_context ioc;
  // The acceptor, its retry timer and Stop's close share one strand.
  boost::asio::ip::tcp::acceptor acceptor{boost::asio::make_strand(ioc)};
  // Re-arms Accept after a failed accept (e.g. out of file descriptors).
  boost::asio::steady_timer accept_retry{acceptor.get_executor()};
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
  ~Session() override;

  void Start();

  // Responder (called from the handler, on the strand).
  void Reply(Response response) override;
  std::shared_ptr<ResponseStream> StartStream(
      int status, const std::string& content_type,
      std::vector<std::pair<std::string, std::string>> headers) override;

  bool Write(std::string data) override;
  void Close() override;
  void RequestCancel() override;

 private:
  boost::beast::tcp_stream& tcp() { return boost::beast::get_lowest_layer(stream_); }
  // Connection (http_session.cc).
  void Handshake();
  void RefusePlainHttp();
  void DrainThenClose();
  void Read();
  // Bounds the read about to start by read_timeout (read_timer_: a timeout cancels it and
  // read_timed_out_ tells its handler; Beast's timeout kReadTimeoutSlack later backs it up).
  void ArmReadTimer();
  // Called first by a read's handler: the timer stopped; true when it had fired.
  bool ReadTimedOut();
  // The read's error answered (or the connection ended); false when there was none.
  bool OnReadError(boost::beast::error_code ec);
  void OnHeader(boost::beast::error_code ec);
  // Admission, the body's size and the body budget; a refusal when the request may not go on.
  std::optional<Response> Admit();
  void ReadBody();
  void OnRead(boost::beast::error_code ec);
  // The request line and headers of the request being read (no body).
  Request Head();
  void Dispatch();
  // While a handler has not answered: a read that sees the client leave (then Cancel) or keeps
  // the first bytes of a pipelined next request; after the answer it is that request's first read
  // (idle_timer_ bounds it).
  void WatchBeforeReply();
  void OnWatch(boost::beast::error_code ec, size_t bytes);
  void SendSimple(Response response, bool close);
  // Sends `response` and closes without reading the request's body (drained unread).
  void Refuse(Response response);
  // Ends the connection: over TLS a close_notify first (unless cancelled), then CloseSocket.
  void Shutdown();
  void CloseSocket();
  // Streamed responses (http_session_stream.cc).
  void BeginStream(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers);
  void WriteNext();
  void WatchForDisconnect();
  void Cancel();

  Stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  BodyReservation reservation_;  // the body of the request being read
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  bool keep_alive_ = false;
  bool http10_ = false;  // the request being answered is HTTP/1.0: a stream is not chunked
  bool reading_ = false, read_timed_out_ = false;
  std::optional<boost::asio::steady_timer> read_timer_;  // read_timeout on a head or body: 408
  bool drain_on_close_ = false;                          // a refused request's body is still coming
  bool awaiting_reply_ = false;                          // dispatched, not answered yet
  bool watching_ = false;                                // WatchBeforeReply's read is pending
  std::optional<boost::asio::steady_timer> idle_timer_;  // the watch read after the answer
  // Streaming state (strand only, except the atomics in SessionBase).
  bool streaming_ = false, writing_ = false, closing_ = false;
  std::deque<std::string> queue_;
  std::shared_ptr<boost::beast::http::response<boost::beast::http::empty_body>> stream_header_;
  std::shared_ptr<boost::beast::http::response_serializer<boost::beast::http::empty_body>>
      serializer_;
  char probe_[1];
  std::optional<boost::asio::steady_timer> close_timer_;  // TLS: bounds the close_notify exchange
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_HTTP_SESSION_H_
