// HttpServer over loopback with a raw-socket client: routing (200, 404, 405), keep-alive, the
// body limit (413), malformed requests (400), a chunked Server-Sent-Events stream written from
// another thread, and a client that disconnects mid-stream cancelling the stream (OnCancel runs,
// Write turns false) — with the connection count back to zero afterwards.
#include "common/http/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/descriptor_exhaustion.h"
#include "common/http/test_client.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

int Connect(int port) { return ConnectLoopback(port); }

void Send(int fd, const std::string& data) {
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
}

// Reads until `until` appears in what was read (or EOF / timeout).
std::string ReadUntil(int fd, const std::string& until) {
  std::string out;
  char buf[4096];
  while (out.find(until) == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

// Waits up to 5 s for the server's connection count to reach 0; true when it did.
bool ConnectionsDrain(const HttpServer& server) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server.connections() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return server.connections() == 0;
}

std::map<std::pair<std::string, std::string>, Handler> Routes(
    std::shared_ptr<ResponseStream>* stream, absl::Notification* stream_started) {
  std::map<std::pair<std::string, std::string>, Handler> routes;
  routes[{"GET", "/health"}] = [](const Request& req, std::shared_ptr<Responder> r) {
    Response res;
    res.content_type = "text/plain";
    res.body = absl::StrCat("ok ", req.query);
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

TEST(HttpServerTest, RoutesLimitsAndKeepAlive) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  // Two requests on one keep-alive connection.
  Send(fd, "GET /health?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  std::string r1 = ReadUntil(fd, "ok x=1");
  EXPECT_NE(r1.find("HTTP/1.1 200"), std::string::npos) << r1;
  Send(fd, "POST /echo HTTP/1.1\r\nHost: a\r\nX-Test: yes\r\nContent-Length: 5\r\n\r\nhello");
  std::string r2 = ReadUntil(fd, "hello|yes");
  EXPECT_NE(r2.find("hello|yes"), std::string::npos) << r2;
  Send(fd, "GET /nope HTTP/1.1\r\nHost: a\r\n\r\n");
  std::string r3 = ReadUntil(fd, "}}");
  EXPECT_NE(r3.find("HTTP/1.1 404"), std::string::npos) << r3;
  EXPECT_NE(r3.find("\"error\""), std::string::npos) << r3;
  Send(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
  std::string r4 = ReadUntil(fd, "}}");
  EXPECT_NE(r4.find("HTTP/1.1 405"), std::string::npos) << r4;
  close(fd);
  // Body over the limit: 413 and the connection closes.
  const int big = Connect((*server)->port());
  Send(big, absl::StrCat("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n",
                         std::string(5000, 'x')));
  std::string r5 = ReadUntil(big, "}}");
  EXPECT_NE(r5.find("HTTP/1.1 413"), std::string::npos) << r5;
  close(big);
  // Garbage: 400.
  const int bad = Connect((*server)->port());
  Send(bad, "NOT AN HTTP REQUEST\r\n\r\n");
  std::string r6 = ReadUntil(bad, "}}");
  EXPECT_NE(r6.find("HTTP/1.1 400"), std::string::npos) << r6;
  close(bad);
}

TEST(HttpServerTest, StreamsChunksAndSeesADisconnect) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  auto server = HttpServer::Start(HttpServerOptions{}, Routes(&stream, &started));
  ASSERT_TRUE(server.ok());
  // A complete stream, written from another thread.
  int fd = Connect((*server)->port());
  Send(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  std::thread writer([&] {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(stream->Write(absl::StrCat("data: ", i, "\n\n")));
    stream->Close();
  });
  std::string all = ReadUntil(fd, "\r\n0\r\n\r\n");
  writer.join();
  EXPECT_NE(all.find("Transfer-Encoding: chunked"), std::string::npos) << all;
  EXPECT_NE(all.find("text/event-stream"), std::string::npos) << all;
  EXPECT_NE(all.find("data: 0"), std::string::npos);
  EXPECT_NE(all.find("data: 2"), std::string::npos);
  close(fd);
  stream.reset();
  // A client that goes away mid-stream: the stream is cancelled.
  absl::Notification started2;
  std::shared_ptr<ResponseStream> stream2;
  auto server2 = HttpServer::Start(HttpServerOptions{}, Routes(&stream2, &started2));
  ASSERT_TRUE(server2.ok());
  fd = Connect((*server2)->port());
  Send(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_TRUE(started2.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::Notification cancelled;
  stream2->OnCancel([&] { cancelled.Notify(); });
  EXPECT_TRUE(stream2->Write("data: first\n\n"));
  ReadUntil(fd, "first");
  close(fd);
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(stream2->cancelled());
  EXPECT_FALSE(stream2->Write("data: more\n\n"));
  stream2.reset();
  EXPECT_TRUE(ConnectionsDrain(**server2));
}

// Sends `request` (a GET /stream), streams two events to it and closes the stream; returns what
// the client read up to the server's close.
std::string StreamTwoEventsToTheClose(const std::string& request) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  auto server = HttpServer::Start(HttpServerOptions{}, Routes(&stream, &started));
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return "";
  const int fd = Connect((*server)->port());
  Send(fd, request);
  EXPECT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  if (!started.HasBeenNotified()) return "";
  EXPECT_TRUE(stream->Write("data: x\n\n"));
  EXPECT_TRUE(stream->Write("data: y\n\n"));
  stream->Close();
  const std::string all = ReadUntil(fd, "never sent");  // to the close
  close(fd);
  stream.reset();
  EXPECT_TRUE(ConnectionsDrain(**server));
  return all;
}

// A streamed response is the connection's last (the server watches the socket for the client
// leaving while it streams), so its header says `Connection: close`: a client that pools
// connections must not send its next request on this one. Before, the header promised
// keep-alive (HTTP/1.1's default) and the server closed after the last chunk: a request sent
// meanwhile was lost with "server disconnected".
TEST(HttpServerTest, StreamedResponseSaysTheConnectionCloses) {
  const std::string all = StreamTwoEventsToTheClose("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n");
  const std::string head = all.substr(0, all.find("\r\n\r\n"));
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_NE(head.find("Transfer-Encoding: chunked"), std::string::npos) << head;
  EXPECT_TRUE(all.ends_with("\r\n0\r\n\r\n")) << all;  // the last chunk, then the close
}

// A body that stops short of its Content-Length (or a chunked one that stalls) gets a 408 after
// read_timeout, then the connection closes; an idle connection (before a first request, or kept
// alive after an answer) still just closes. Before, the short body was closed without a word
// (Beast's timeout closed the socket first).
TEST(HttpServerTest, ABodyThatStopsShortIsA408AndAnIdleConnectionJustCloses) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.read_timeout = absl::Milliseconds(300);
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& request :
       {std::string("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"),
        std::string("POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "3\r\nabc\r\n")}) {
    const int fd = Connect((*server)->port());
    const absl::Time sent = absl::Now();
    Send(fd, request);
    const std::string r = ReadUntil(fd, "never sent");  // to the close
    const absl::Duration took = absl::Now() - sent;
    EXPECT_NE(r.find("HTTP/1.1 408"), std::string::npos) << r;
    EXPECT_NE(r.find("did not arrive within 300ms"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
    EXPECT_GE(took, absl::Milliseconds(250));
    EXPECT_LT(took, absl::Seconds(4));
    close(fd);
  }
  const int idle = Connect((*server)->port());
  EXPECT_EQ(ReadUntil(idle, "never sent"), "");
  close(idle);
  const int kept = Connect((*server)->port());
  Send(kept, "GET /health HTTP/1.1\r\nHost: a\r\n\r\n");
  const std::string answer = ReadUntil(kept, "never sent");
  EXPECT_NE(answer.find("HTTP/1.1 200"), std::string::npos) << answer;
  EXPECT_EQ(answer.find("408"), std::string::npos) << answer;
  close(kept);
  EXPECT_TRUE(ConnectionsDrain(**server));
}

// A request line or headers that stop coming get a 408 after read_timeout too (a JSON error,
// `Connection: close`), whether on a fresh connection or after a kept-alive answer; a connection
// on which no byte of a next request came still just closes. Before, a stalled request line or
// headers were closed without a word (Beast's timeout closed the socket: EOF, nothing read).
TEST(HttpServerTest, AStalledRequestLineOrHeadersIsA408) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.read_timeout = absl::Milliseconds(300);
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok()) << server.status();
  const auto expect_408 = [](int fd, const std::string& stalled) {
    const absl::Time sent = absl::Now();
    Send(fd, stalled);
    const std::string r = ReadUntil(fd, "never sent");  // to the close
    const absl::Duration took = absl::Now() - sent;
    EXPECT_TRUE(r.starts_with("HTTP/1.1 408")) << stalled << " -> " << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
    EXPECT_NE(r.find("application/json"), std::string::npos) << r;
    EXPECT_NE(r.find("request line and headers did not arrive within 300ms"), std::string::npos)
        << r;
    EXPECT_NE(r.find("\"code\":408"), std::string::npos) << r;
    EXPECT_GE(took, absl::Milliseconds(250));
    EXPECT_LT(took, absl::Seconds(4));
  };
  for (const std::string& stalled :
       {std::string("G"), std::string("GET /health HTTP/1.1\r\nHost: a\r\n"),
        std::string("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Le")}) {
    const int fd = Connect((*server)->port());
    expect_408(fd, stalled);
    close(fd);
  }
  // After a kept-alive answer: the next request's stalled start is a 408 as well.
  const int kept = Connect((*server)->port());
  Send(kept, "GET /health HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_NE(ReadUntil(kept, "ok ").find("HTTP/1.1 200"), std::string::npos);
  expect_408(kept, "GET /health HTTP/1.1\r\n");
  close(kept);
  // Not a byte: closed without an answer.
  const int idle = Connect((*server)->port());
  EXPECT_EQ(ReadUntil(idle, "never sent"), "");
  close(idle);
  EXPECT_TRUE(ConnectionsDrain(**server));
}

// HTTP/1.0 has no chunked coding: a 1.0 client's stream is the raw bytes with Connection: close,
// its end the close. Before, 1.0 clients got chunk sizes inside their event stream.
TEST(HttpServerTest, AnHttp10StreamIsUnchunkedAndEndsAtTheClose) {
  const std::string all = StreamTwoEventsToTheClose("GET /stream HTTP/1.0\r\n\r\n");
  const size_t end_of_head = all.find("\r\n\r\n");
  ASSERT_NE(end_of_head, std::string::npos) << all;
  const std::string head = all.substr(0, end_of_head);
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_EQ(head.find("Content-Length"), std::string::npos) << head;
  EXPECT_EQ(all.substr(end_of_head + 4), "data: x\n\ndata: y\n\n");
}

// A handler that answers later (a generation running elsewhere): the client that leaves before
// the answer cancels it (OnCancel runs, the late Reply is dropped); one that stays gets its answer
// and then the next request on the same connection, whether it sent it after the answer or
// pipelined before it; an idle connection after such an answer still closes after read_timeout.
// Before, only streams saw a client leave: a non-streamed request ran to its end for nobody.
TEST(HttpServerTest, AClientLeavingBeforeALateAnswerCancelsIt) {
  absl::Mutex mu;
  std::vector<std::shared_ptr<Responder>> pending;
  std::map<std::pair<std::string, std::string>, Handler> routes;
  routes[{"GET", "/later"}] = [&](const Request&, std::shared_ptr<Responder> r) {
    absl::MutexLock lock(&mu);
    pending.push_back(std::move(r));
  };
  routes[{"GET", "/now"}] = [](const Request&, std::shared_ptr<Responder> r) {
    Response res;
    res.body = "now";
    r->Reply(res);
  };
  const auto take = [&] {
    auto ready = [&] { return !pending.empty(); };
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(5)));
    std::shared_ptr<Responder> r = pending.empty() ? nullptr : pending.front();
    if (r != nullptr) pending.erase(pending.begin());
    return r;
  };
  const auto answer = [](const std::shared_ptr<Responder>& r, const std::string& body) {
    Response res;
    res.body = body;
    std::thread([r, res] { r->Reply(res); }).detach();
  };
  HttpServerOptions options;
  options.read_timeout = absl::Milliseconds(500);
  auto server = HttpServer::Start(options, std::move(routes));
  ASSERT_TRUE(server.ok());
  // The client leaves before the answer: cancelled; the answer that comes anyway goes nowhere.
  int fd = Connect((*server)->port());
  Send(fd, "GET /later HTTP/1.1\r\nHost: a\r\n\r\n");
  std::shared_ptr<Responder> left = take();
  ASSERT_NE(left, nullptr);
  absl::Notification cancelled;
  left->OnCancel([&] { cancelled.Notify(); });
  close(fd);
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  answer(left, "late");
  left.reset();
  // The client stays: its answer, then a request sent after it, then one pipelined before it.
  fd = Connect((*server)->port());
  Send(fd, "GET /later HTTP/1.1\r\nHost: a\r\n\r\n");
  std::shared_ptr<Responder> r = take();
  ASSERT_NE(r, nullptr);
  std::atomic<bool> wrongly_cancelled{false};
  r->OnCancel([&] { wrongly_cancelled = true; });
  absl::SleepFor(absl::Milliseconds(700));  // longer than read_timeout: waiting is no timeout
  answer(r, "first");
  EXPECT_NE(ReadUntil(fd, "first").find("HTTP/1.1 200"), std::string::npos);
  Send(fd, "GET /now HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_NE(ReadUntil(fd, "now").find("now"), std::string::npos);
  Send(fd, "GET /later HTTP/1.1\r\nHost: a\r\n\r\nGET /now HTTP/1.1\r\nHost: a\r\n\r\n");
  r = take();
  ASSERT_NE(r, nullptr);
  absl::SleepFor(absl::Milliseconds(50));  // the pipelined request's bytes arrive meanwhile
  answer(r, "second");
  const std::string both = ReadUntil(fd, "now");
  EXPECT_NE(both.find("second"), std::string::npos) << both;
  EXPECT_LT(both.find("second"), both.find("now")) << both;
  EXPECT_FALSE(wrongly_cancelled.load());
  // Idle after an answer: closed after read_timeout.
  Send(fd, "GET /later HTTP/1.1\r\nHost: a\r\n\r\n");
  r = take();
  ASSERT_NE(r, nullptr);
  answer(r, "third");
  EXPECT_NE(ReadUntil(fd, "third").find("third"), std::string::npos);
  const absl::Time idle_start = absl::Now();
  char byte;
  EXPECT_EQ(read(fd, &byte, 1), 0);
  EXPECT_LT(absl::Now() - idle_start, absl::Seconds(5));
  close(fd);
  r.reset();
  EXPECT_TRUE(ConnectionsDrain(**server));
}

// Issue 30 item 2: the admission check (an API key) runs on the headers: a refused client gets its
// answer without sending a byte of its body, so it cannot make the server buffer one.
TEST(HttpServerTest, AdmissionDecidesOnTheHeadersBeforeTheBody) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  std::atomic<int> admitted{0};
  options.admission = [&](const Request& head) -> std::optional<Response> {
    EXPECT_TRUE(head.body.empty());
    if (head.Header("authorization") == "Bearer good") {
      ++admitted;
      return std::nullopt;
    }
    return ErrorResponse(401, "invalid or missing API key");
  };
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok()) << server.status();
  // Announces 8 MiB and sends none of it: answered at once (it would wait 30 s for the body).
  const int keyless = Connect((*server)->port());
  Send(keyless, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 8388608\r\n\r\n");
  const absl::Time start = absl::Now();
  std::string r1 = ReadUntil(keyless, "}}");
  EXPECT_NE(r1.find("HTTP/1.1 401"), std::string::npos) << r1;
  EXPECT_NE(r1.find("Connection: close"), std::string::npos) << r1;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The body it then sends is drained unread: the server closes the connection after it.
  const std::string chunk(64 * 1024, 'x');
  for (int i = 0; i < 16; ++i) {
    if (write(keyless, chunk.data(), chunk.size()) <= 0) break;
  }
  close(keyless);
  EXPECT_EQ(admitted.load(), 0);
  // With the key, the same request is read and served.
  TestResponse ok = HttpCall((*server)->port(), "POST", "/echo", "hello",
                             {"Authorization: Bearer good", "X-Test: k"});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "hello|k");
  EXPECT_EQ(admitted.load(), 1);
}

// A body announced over the limit is refused from its headers (413) without being read.
TEST(HttpServerTest, AnnouncedBodyOverTheLimitIsRefusedUnread) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok());
  const int fd = Connect((*server)->port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n");
  std::string r = ReadUntil(fd, "}}");
  EXPECT_NE(r.find("HTTP/1.1 413"), std::string::npos) << r;
  EXPECT_NE(r.find("over 1000 bytes"), std::string::npos) << r;
  close(fd);
}

// Bodies in flight are bounded server-wide: past the budget a request gets 503 + Retry-After
// from its headers; once the admitted one is handled its bytes are free again.
TEST(HttpServerTest, BodiesInFlightStayWithinTheBudget) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  HttpServerOptions options;
  options.max_body_bytes = 700 * 1024;
  options.max_buffered_body_bytes = 1024 * 1024;
  auto server = HttpServer::Start(options, Routes(&stream, &started));
  ASSERT_TRUE(server.ok());
  const std::string body(600 * 1024, 'b');
  const std::string head =
      absl::StrCat("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: ", body.size(), "\r\n\r\n");
  const int first = Connect((*server)->port());
  Send(first, head);  // admitted: 600 KiB reserved while its body comes
  absl::SleepFor(absl::Milliseconds(200));
  const int second = Connect((*server)->port());
  Send(second, head);
  std::string busy = ReadUntil(second, "}}");
  EXPECT_NE(busy.find("HTTP/1.1 503"), std::string::npos) << busy;
  EXPECT_NE(busy.find("Retry-After: 1"), std::string::npos) << busy;
  close(second);
  // Small bodies still fit beside it.
  TestResponse small = HttpCall((*server)->port(), "POST", "/echo", "tiny", {"X-Test: s"});
  EXPECT_EQ(small.status, 200);
  Send(first, body);
  std::string done = ReadUntil(first, "|");
  EXPECT_NE(done.find("HTTP/1.1 200"), std::string::npos) << done.substr(0, 200);
  close(first);
  // Its 600 KiB are back once its handler has returned (the reply can reach the client a moment
  // before that): the next one is admitted.
  TestResponse again;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  do {
    again = HttpCall((*server)->port(), "POST", "/echo", body, {"X-Test: t"});
  } while (again.status == 503 && absl::Now() < deadline);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body.size(), body.size() + 2);
}

// `Expect: 100-continue` gets its interim answer once admitted (curl waits 1 s for it otherwise).
TEST(HttpServerTest, ExpectContinueIsAnswered) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  auto server = HttpServer::Start(HttpServerOptions{}, Routes(&stream, &started));
  ASSERT_TRUE(server.ok());
  const int fd = Connect((*server)->port());
  Send(fd, "POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  std::string interim = ReadUntil(fd, "\r\n\r\n");
  EXPECT_NE(interim.find("HTTP/1.1 100 Continue"), std::string::npos) << interim;
  Send(fd, "hi");
  std::string r = ReadUntil(fd, "hi|");
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
  close(fd);
}

// A failed accept (here EMFILE: the process is out of file descriptors, as under a connection
// flood) must not stop the server accepting: once descriptors are free again, the connection
// that waited in the backlog is served. Before, the acceptor returned on the error and the port
// never accepted again (the daemon's HTTP plane was dead until a restart).
TEST(HttpServerTest, AcceptsAgainAfterRunningOutOfFileDescriptors) {
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  auto server = HttpServer::Start(HttpServerOptions{}, Routes(&stream, &started));
  ASSERT_TRUE(server.ok());
  const int fd = ConnectWhileOutOfDescriptors((*server)->port(), absl::Milliseconds(300));
  ASSERT_GE(fd, 0);  // meanwhile the server's accept failed (EMFILE), maybe again
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  Send(fd, "GET /health?x=2 HTTP/1.1\r\nHost: a\r\n\r\n");
  const std::string r = ReadUntil(fd, "ok x=2");
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << "no answer: " << r;
  close(fd);
  EXPECT_EQ(HttpCall((*server)->port(), "GET", "/health").status, 200);
}

// One server's connections stay within a quarter of the descriptor limit, so that a flood of
// them leaves descriptors for the process's other ports and files (at the limit every accept()
// fails, and the gRPC library's listener then stops for good).
TEST(HttpServerTest, ConnectionsStayWithinAQuarterOfTheDescriptorLimit) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 400;  // a cap of 100
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::shared_ptr<ResponseStream> stream;
  absl::Notification started;
  auto server = HttpServer::Start(HttpServerOptions{}, Routes(&stream, &started));
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(server.ok());
  std::vector<int> clients;
  for (int i = 0; i < 130; ++i) clients.push_back(Connect((*server)->port()));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_LE((*server)->connections(), 100);
  EXPECT_GE((*server)->connections(), 90);
  for (int fd : clients) close(fd);
  EXPECT_TRUE(ConnectionsDrain(**server));
  EXPECT_EQ(HttpCall((*server)->port(), "GET", "/health").status, 200);
}

}  // namespace
}  // namespace tandem::http
