#include "common/http/http_server.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crash_handler.h"
#include "common/daemon.h"
#include "common/http/http_session.h"
#include "common/http/tls_context.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"

namespace tandem::http {
namespace {

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

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

void HttpServer::Impl::Accept(std::shared_ptr<Impl> self) {
  acceptor.async_accept(
      net::make_strand(ioc), [this, self](beast::error_code ec, tcp::socket socket) {
        if (stopping.load() || ec == net::error::operation_aborted) return;
        if (ec) {
          // EMFILE / ENFILE (the process or host is out of file descriptors), ENOBUFS, ...: the
          // listening socket is fine, so accept again once connections have had time to close.
          // Returning here instead would stop accepting for the rest of the process's life.
          LOG_EVERY_N(WARNING, 100) << "http: accept failed (" << ec.message() << "); retrying in "
                                    << kAcceptRetry.count() << " ms";
          accept_retry.expires_after(kAcceptRetry);
          accept_retry.async_wait([this, self](beast::error_code wait_ec) {
            if (!wait_ec && !stopping.load()) Accept(self);
          });
          return;
        }
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
  net::post(acceptor.get_executor(), [this] {
    beast::error_code ignored;
    acceptor.close(ignored);
    accept_retry.cancel();
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
  // A flood of connections cannot take every descriptor of the process (the gRPC ports' accepts
  // and every file or socket it opens would fail).
  impl->options.max_connections = WithinAQuarterOfTheOpenFileLimit(options.max_connections);
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
