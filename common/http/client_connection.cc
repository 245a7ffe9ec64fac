#include "common/http/client_connection.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/http/tls_context.h"

namespace tandem::http {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

}  // namespace

struct ClientConnection::Impl {
  net::io_context ioc;
  std::unique_ptr<net::ssl::context> ctx;            // TLS only
  std::optional<net::ssl::stream<tcp::socket>> tls;  // TLS only
  std::optional<tcp::socket> plain;                  // plain only

  tcp::socket& socket() { return tls ? tls->next_layer() : *plain; }
};

ClientConnection::ClientConnection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ClientConnection::~ClientConnection() { Close(); }

absl::StatusOr<std::unique_ptr<ClientConnection>> ClientConnection::Connect(
    const std::string& host, const std::string& port, const std::optional<ClientTlsOptions>& tls) {
  auto impl = std::make_unique<Impl>();
  std::string bare_host = host;  // "[::1]" -> "::1"
  if (bare_host.size() > 2 && bare_host.front() == '[' && bare_host.back() == ']') {
    bare_host = bare_host.substr(1, bare_host.size() - 2);
  }
  if (tls.has_value()) {
    absl::StatusOr<std::unique_ptr<net::ssl::context>> ctx = MakeClientTlsContext(*tls);
    if (!ctx.ok()) return ctx.status();
    impl->ctx = *std::move(ctx);
    impl->tls.emplace(impl->ioc, *impl->ctx);
  } else {
    impl->plain.emplace(impl->ioc);
  }
  boost::system::error_code ec;
  tcp::resolver resolver(impl->ioc);
  const auto endpoints = resolver.resolve(bare_host, port, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host, ":", port, ": ", ec.message()));
  }
  net::connect(impl->socket(), endpoints, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", host, ":", port, ": ", ec.message()));
  }
  if (impl->tls) {
    const std::string name = tls->server_name.empty() ? bare_host : tls->server_name;
    boost::system::error_code not_ip;
    net::ip::make_address(name, not_ip);
    // SNI is for DNS names only (RFC 6066).
    if (not_ip) SSL_set_tlsext_host_name(impl->tls->native_handle(), name.c_str());
    impl->tls->set_verify_callback(net::ssl::host_name_verification(name));
    impl->tls->handshake(net::ssl::stream_base::client, ec);
    if (ec) {
      std::string why = ec.message();
      const long verify = SSL_get_verify_result(impl->tls->native_handle());
      if (verify != X509_V_OK) {
        why = absl::StrCat(why, " (", X509_verify_cert_error_string(verify), ")");
      }
      return absl::UnavailableError(
          absl::StrCat("TLS handshake with ", host, ":", port, " (as ", name, ") failed: ", why));
    }
  }
  return std::unique_ptr<ClientConnection>(new ClientConnection(std::move(impl)));
}

absl::Status ClientConnection::Write(absl::string_view data) {
  boost::system::error_code ec;
  if (impl_->tls) {
    net::write(*impl_->tls, net::buffer(data.data(), data.size()), ec);
  } else {
    net::write(*impl_->plain, net::buffer(data.data(), data.size()), ec);
  }
  if (ec) return absl::UnavailableError(absl::StrCat("write failed: ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<size_t> ClientConnection::ReadSome(char* buffer, size_t size) {
  boost::system::error_code ec;
  const size_t n = impl_->tls ? impl_->tls->read_some(net::buffer(buffer, size), ec)
                              : impl_->plain->read_some(net::buffer(buffer, size), ec);
  if (ec == net::error::eof || ec == net::ssl::error::stream_truncated) return size_t{0};
  if (ec) return absl::UnavailableError(absl::StrCat("read failed: ", ec.message()));
  return n;
}

void ClientConnection::Close() {
  boost::system::error_code ignored;
  impl_->socket().shutdown(tcp::socket::shutdown_both, ignored);
  impl_->socket().close(ignored);
}

}  // namespace tandem::http
