// HttpServer with TLS over loopback, with certificates from deploy/certs/make_certs.sh: a round
// trip (and two requests on one kept-alive TLS connection), a plain HTTP client refused with a
// plain 400, clients that do not trust the server's CA or expect another name refused at the
// handshake, a chunked stream over TLS ending with close_notify, a TLS client going away
// mid-stream cancelling the stream, mutual TLS (no / foreign client certificate refused), and bad
// TLS material refused at Start.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/http/client_connection.h"
#include "common/http/http_server.h"
#include "common/http/test_client.h"
#include "common/security/test_certs.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

struct Pki {
  ServerTlsOptions server;  // router.pem, no client CA
  ClientTlsOptions client;  // trusts the cluster CA, no certificate
  ClientTlsOptions client_with_cert;
  ClientTlsOptions other_ca;  // trusts another CA only; presents that CA's certificate
};

Pki MakePki() {
  absl::StatusOr<security::TestCerts> certs = security::MakeTestCerts("cluster");
  absl::StatusOr<security::TestCerts> other = security::MakeTestCerts("other");
  EXPECT_TRUE(certs.ok() && other.ok());
  const security::SecurityConfig router = certs->Config("router");
  const security::SecurityConfig client = certs->Config("client");
  const security::SecurityConfig stranger = other->Config("client");
  Pki pki;
  pki.server = {router.tls.cert_pem, router.tls.key_pem, ""};
  pki.client.ca_pem = router.tls.ca_pem;
  pki.client_with_cert = {client.tls.ca_pem, "", client.tls.cert_pem, client.tls.key_pem};
  pki.other_ca = {stranger.tls.ca_pem, "", stranger.tls.cert_pem, stranger.tls.key_pem};
  return pki;
}

const Pki& TestPki() {
  static const Pki* pki = new Pki(MakePki());
  return *pki;
}

std::map<std::pair<std::string, std::string>, Handler> Routes(
    std::shared_ptr<ResponseStream>* stream, absl::Notification* stream_started) {
  std::map<std::pair<std::string, std::string>, Handler> routes;
  routes[{"GET", "/health"}] = [](const Request&, std::shared_ptr<Responder> r) {
    Response res;
    res.content_type = "text/plain";
    res.body = "ok";
    r->Reply(res);
  };
  routes[{"POST", "/echo"}] = [](const Request& req, std::shared_ptr<Responder> r) {
    Response res;
    res.body = req.body + "|" + req.Header("x-test");
    r->Reply(res);
  };
  routes[{"GET", "/stream"}] = [stream, stream_started](const Request&,
                                                        std::shared_ptr<Responder> r) {
    *stream = r->StartStream(200, "text/event-stream");
    stream_started->Notify();
  };
  return routes;
}

std::unique_ptr<HttpServer> StartTls(const ServerTlsOptions& tls,
                                     std::shared_ptr<ResponseStream>* stream,
                                     absl::Notification* started) {
  HttpServerOptions options;
  options.tls = tls;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, Routes(stream, started));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<ClientConnection> Dial(int port, const ClientTlsOptions& tls) {
  absl::StatusOr<std::unique_ptr<ClientConnection>> conn =
      ClientConnection::Connect("127.0.0.1", absl::StrCat(port), tls);
  EXPECT_TRUE(conn.ok()) << conn.status();
  return conn.ok() ? *std::move(conn) : nullptr;
}

// Reads until `until` appears (or the server closes); `eof` tells whether it closed.
std::string ReadUntil(ClientConnection& conn, const std::string& until, bool* eof = nullptr) {
  std::string out;
  char buf[4096];
  while (out.find(until) == std::string::npos) {
    absl::StatusOr<size_t> n = conn.ReadSome(buf, sizeof(buf));
    if (!n.ok() || *n == 0) {
      if (eof != nullptr) *eof = n.ok();
      break;
    }
    out.append(buf, *n);
  }
  return out;
}

void WaitForNoConnections(const HttpServer& server) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server.connections() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.connections(), 0);
}

TEST(HttpsServerTest, RoundTripAndRefusals) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  std::unique_ptr<HttpServer> server = StartTls(TestPki().server, &stream, &started);
  ASSERT_NE(server, nullptr);
  const int port = server->port();

  TestResponse ok = HttpsCall(port, TestPki().client, "POST", "/echo", "hello", {"X-Test: tls"});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "hello|tls");

  // Two requests on one kept-alive TLS connection.
  std::unique_ptr<ClientConnection> conn = Dial(port, TestPki().client);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->Write("GET /health HTTP/1.1\r\nHost: a\r\n\r\n").ok());
  EXPECT_NE(ReadUntil(*conn, "ok").find("HTTP/1.1 200"), std::string::npos);
  ASSERT_TRUE(conn->Write("GET /nope HTTP/1.1\r\nHost: a\r\n\r\n").ok());
  EXPECT_NE(ReadUntil(*conn, "}}").find("HTTP/1.1 404"), std::string::npos);
  conn.reset();

  // Plain HTTP to the TLS port: a plain 400 naming the problem, nothing routed.
  TestResponse plain = HttpCall(port, "GET", "/health");
  EXPECT_EQ(plain.status, 400);
  EXPECT_NE(plain.body.find("https://"), std::string::npos) << plain.body;
  // ... also with a large body behind it (the server drains it before closing, so no reset
  // destroys the 400).
  TestResponse plain_post = HttpCall(port, "POST", "/echo", std::string(1 << 20, 'x'));
  EXPECT_EQ(plain_post.status, 400);

  // A client that does not trust the server's CA, or expects another name, stops at the
  // handshake.
  absl::StatusOr<std::unique_ptr<ClientConnection>> untrusted =
      ClientConnection::Connect("127.0.0.1", absl::StrCat(port), TestPki().other_ca);
  ASSERT_FALSE(untrusted.ok());
  EXPECT_EQ(untrusted.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(untrusted.status().message().find("certificate verify failed"), std::string::npos)
      << untrusted.status();
  ClientTlsOptions wrong_name = TestPki().client;
  wrong_name.server_name = "not-in-the-certificate.example";
  EXPECT_FALSE(ClientConnection::Connect("127.0.0.1", absl::StrCat(port), wrong_name).ok());
  EXPECT_EQ(HttpsCall(port, TestPki().client, "GET", "/health").status, 200);  // still serving
  WaitForNoConnections(*server);
}

// Over TLS too a body that stops short of its Content-Length, or a request line / headers that
// stop coming, are answered 408 (the pending TLS read is cancelled, then the answer written) and
// the connection closed.
TEST(HttpsServerTest, AStalledBodyOrHeadIsA408) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.tls = TestPki().server;
  options.read_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& stalled :
       {std::string("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"),
        std::string("GET /health HTTP/1.1\r\nHo")}) {
    std::unique_ptr<ClientConnection> conn = Dial((*server)->port(), TestPki().client);
    ASSERT_NE(conn, nullptr);
    ASSERT_TRUE(conn->Write(stalled).ok());
    bool eof = false;
    const std::string r = ReadUntil(*conn, "never sent", &eof);
    EXPECT_NE(r.find("HTTP/1.1 408"), std::string::npos) << stalled << " -> " << r;
    EXPECT_NE(r.find("did not arrive"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  }
  WaitForNoConnections(**server);
}

TEST(HttpsServerTest, StreamsOverTlsAndSeesADisconnect) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  std::unique_ptr<HttpServer> server = StartTls(TestPki().server, &stream, &started);
  ASSERT_NE(server, nullptr);
  // A complete stream written from another thread; the server then closes with close_notify
  // (a clean end of the TLS stream, not a truncation).
  std::unique_ptr<ClientConnection> conn = Dial(server->port(), TestPki().client);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->Write("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n").ok());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  std::thread writer([&] {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(stream->Write(absl::StrCat("data: ", i, "\n\n")));
    stream->Close();
  });
  bool eof = false;
  const std::string all = ReadUntil(*conn, "never sent", &eof);
  writer.join();
  EXPECT_TRUE(eof);
  EXPECT_NE(all.find("Transfer-Encoding: chunked"), std::string::npos) << all;
  EXPECT_EQ(Dechunk(all.substr(all.find("\r\n\r\n") + 4)), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  EXPECT_NE(all.find("\r\n0\r\n\r\n"), std::string::npos) << all;
  conn.reset();
  stream.reset();

  // A TLS client that goes away mid-stream: the stream is cancelled.
  absl::Notification started2;
  std::shared_ptr<ResponseStream> stream2;
  std::unique_ptr<HttpServer> server2 = StartTls(TestPki().server, &stream2, &started2);
  ASSERT_NE(server2, nullptr);
  conn = Dial(server2->port(), TestPki().client);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->Write("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n").ok());
  ASSERT_TRUE(started2.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::Notification cancelled;
  stream2->OnCancel([&] { cancelled.Notify(); });
  EXPECT_TRUE(stream2->Write("data: first\n\n"));
  EXPECT_NE(ReadUntil(*conn, "first").find("first"), std::string::npos);
  conn->Close();
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(stream2->cancelled());
  EXPECT_FALSE(stream2->Write("data: more\n\n"));
  stream2.reset();
  WaitForNoConnections(*server2);
}

TEST(HttpsServerTest, MutualTlsNeedsAClientCertificateFromTheCa) {
  ServerTlsOptions tls = TestPki().server;
  tls.client_ca_pem = TestPki().client.ca_pem;
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  std::unique_ptr<HttpServer> server = StartTls(tls, &stream, &started);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(HttpsCall(server->port(), TestPki().client_with_cert, "GET", "/health").status, 200);
  EXPECT_EQ(HttpsCall(server->port(), TestPki().client, "GET", "/health").status, 0);
  ClientTlsOptions foreign_cert = TestPki().other_ca;
  foreign_cert.ca_pem = TestPki().client.ca_pem;  // trusts the server, presents another CA's cert
  EXPECT_EQ(HttpsCall(server->port(), foreign_cert, "GET", "/health").status, 0);
  WaitForNoConnections(*server);
}

TEST(HttpsServerTest, BadTlsMaterialIsRefusedAtStart) {
  ServerTlsOptions mismatched = TestPki().server;
  mismatched.key_pem = TestPki().client_with_cert.key_pem;  // another certificate's key
  HttpServerOptions options;
  options.tls = mismatched;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(options, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  options.tls->key_pem = "not a key";
  EXPECT_EQ(HttpServer::Start(options, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::http
