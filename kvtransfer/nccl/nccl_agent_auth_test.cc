// The NCCL control socket's authentication on CPU (nccl_agent_auth.h): tokens and proofs (bound
// to one challenge, forged / tampered / foreign / expired ones refused, shared by the ranks of a
// group), and both halves of the opening exchange over real loopback connections: AcceptHello
// (source) against SendHello (reader) and against hand-made frames. A hello without a
// credential, with a forged one, or replayed from another connection, a first frame that is not
// a hello, or one announcing a large payload is refused before anything else happens; the
// listener binds the configured interface only.
#include "kvtransfer/nccl/nccl_agent_auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer::nccl_auth {
namespace {

const std::string kKey(32, 'k');
const std::string kIds(nccl_wire::kUniqueIdBytes, 'i');
const std::string kChallenge(nccl_wire::kChallengeBytes, 'c');

TEST(ControlTokenTest, AProofOpensOnlyTheChallengeItAnswersAndEveryRankChecksIt) {
  ControlTokenAuthority rank0(kKey), rank1(kKey);
  ASSERT_TRUE(rank0.Validate().ok());
  const std::string token = rank0.Issue();
  ASSERT_EQ(token.size(), kTokenBytes);
  EXPECT_NE(rank0.Issue(), token) << "every token is fresh";
  const std::string proof = Prove(token, kChallenge);
  ASSERT_EQ(proof.size(), kCredentialBytes);
  EXPECT_EQ(proof.find(token.substr(kNonceBytes + 8)), std::string::npos)
      << "the token's secret never crosses the socket";
  EXPECT_TRUE(rank0.Verify(proof, kChallenge).ok());
  EXPECT_TRUE(rank1.Verify(proof, kChallenge).ok()) << "another rank of the group (same key)";
  EXPECT_TRUE(rank0.Verify(Prove(token, std::string(32, 'd')), std::string(32, 'd')).ok())
      << "one token, several connections (several reader ranks)";
  EXPECT_EQ(rank0.Verify(proof, std::string(32, 'd')).code(), absl::StatusCode::kPermissionDenied)
      << "a proof replayed against another challenge";
}

TEST(ControlTokenTest, ForgedTamperedAndForeignCredentialsAreRefused) {
  ControlTokenAuthority source(kKey), other(std::string(32, 'o'));
  EXPECT_EQ(source.Verify(Prove(other.Issue(), kChallenge), kChallenge).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(source.Verify("", kChallenge).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(source.Verify(std::string(kCredentialBytes, '\0'), kChallenge).code(),
            absl::StatusCode::kPermissionDenied);
  const std::string token = source.Issue();
  EXPECT_EQ(Prove(token.substr(1), kChallenge), "") << "not a token";
  const std::string proof = Prove(token, kChallenge);
  for (size_t i : {size_t{0}, kNonceBytes, kNonceBytes + 7, kCredentialBytes - 1}) {
    std::string tampered = proof;
    tampered[i] = static_cast<char>(tampered[i] ^ 1);
    EXPECT_EQ(source.Verify(tampered, kChallenge).code(), absl::StatusCode::kPermissionDenied)
        << "byte " << i;
  }
  EXPECT_TRUE(source.Verify(proof, kChallenge).ok());
}

TEST(ControlTokenTest, TokensExpire) {
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  ControlTokenAuthority source(kKey, absl::Seconds(60), [&] { return now; });
  const std::string token = source.Issue();
  now += absl::Seconds(59);
  EXPECT_TRUE(source.Verify(Prove(token, kChallenge), kChallenge).ok());
  now += absl::Seconds(2);
  EXPECT_EQ(source.Verify(Prove(token, kChallenge), kChallenge).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ControlTokenTest, WithoutAKeyNothingIsIssuedOrChecked) {
  ControlTokenAuthority open("");
  EXPECT_FALSE(open.enabled());
  EXPECT_EQ(open.Issue(), "");
  EXPECT_TRUE(open.Verify("", kChallenge).ok());
  EXPECT_EQ(ControlTokenAuthority("short").Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ControlTokenAuthority(kKey, absl::ZeroDuration()).Validate().code(),
            absl::StatusCode::kInvalidArgument);
}

// A listener on loopback; Attempt connects, lets `reader` talk on the client end and runs
// AcceptHello on the accepted end.
class AcceptHelloTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> fd = nccl_socket::Listen("127.0.0.1", 0, &port_);
    ASSERT_TRUE(fd.ok()) << fd.status();
    listen_fd_ = *fd;
  }
  void TearDown() override { close(listen_fd_); }
  absl::StatusOr<std::string> Attempt(const std::function<void(int fd)>& reader) {
    absl::StatusOr<int> client = nccl_socket::Connect("127.0.0.1", port_, absl::Seconds(5));
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return client.status();
    const int served = accept(listen_fd_, nullptr, nullptr);
    EXPECT_GE(served, 0);
    std::thread talk([&] { reader(*client); });
    absl::StatusOr<std::string> ids = AcceptHello(served, auth_, stop_, absl::Milliseconds(500));
    close(served);
    talk.join();
    close(*client);
    return ids;
  }
  // The reader's side as NcclAgent plays it.
  std::function<void(int)> Reader(const std::string& token) {
    return
        [this, token](int fd) { last_send_ = SendHello(fd, token, kIds, stop_, absl::Seconds(2)); };
  }
  // Reads the challenge, then sends `frame` (hand-made).
  std::function<void(int)> Raw(const std::string& frame) {
    return [this, frame](int fd) {
      nccl_wire::MessageType type;
      std::string challenge;
      ASSERT_TRUE(nccl_socket::RecvFrame(fd, stop_, absl::Seconds(2), &type, &challenge).ok());
      EXPECT_EQ(type, nccl_wire::MessageType::kChallenge);
      EXPECT_EQ(challenge.size(), nccl_wire::kChallengeBytes);
      last_challenge_ = challenge;
      send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    };
  }
  static std::string Frame(nccl_wire::MessageType type, const std::string& payload) {
    return nccl_wire::EncodeHeader(type, static_cast<uint32_t>(payload.size())) + payload;
  }

  ControlTokenAuthority auth_{kKey};
  std::atomic<bool> stop_{false};
  absl::Status last_send_;
  std::string last_challenge_;
  int listen_fd_ = -1;
  int port_ = 0;
};

TEST_F(AcceptHelloTest, ListenerBindsTheConfiguredInterfaceOnly) {
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ASSERT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len), 0);
  EXPECT_EQ(ntohl(bound.sin_addr.s_addr), INADDR_LOOPBACK) << "not the wildcard address";
}

TEST_F(AcceptHelloTest, OnlyAReaderHoldingALiveTokenOpensTheConnection) {
  const std::string token = auth_.Issue();
  for (int connection = 0; connection < 2; ++connection) {  // one token, two reader ranks
    absl::StatusOr<std::string> ids = Attempt(Reader(token));
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_TRUE(last_send_.ok()) << last_send_;
    EXPECT_EQ(*ids, kIds);
  }
  EXPECT_EQ(Attempt(Reader("")).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Attempt(Reader(std::string(kTokenBytes, 'x'))).status().code(),
            absl::StatusCode::kPermissionDenied);
  ControlTokenAuthority stranger(std::string(32, 's'));
  EXPECT_EQ(Attempt(Reader(stranger.Issue())).status().code(), absl::StatusCode::kPermissionDenied);
  // A sniffer replays a hello it saw: the new connection's challenge differs.
  std::string seen_challenge;
  absl::StatusOr<std::string> first = Attempt([&](int fd) {
    nccl_wire::MessageType type;
    ASSERT_TRUE(nccl_socket::RecvFrame(fd, stop_, absl::Seconds(2), &type, &seen_challenge).ok());
    const std::string hello = Frame(nccl_wire::MessageType::kHello,
                                    *nccl_wire::EncodeHello(Prove(token, seen_challenge), kIds));
    send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
  });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string replayed = Frame(nccl_wire::MessageType::kHello,
                                     *nccl_wire::EncodeHello(Prove(token, seen_challenge), kIds));
  EXPECT_EQ(Attempt(Raw(replayed)).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(AcceptHelloTest, AnythingButAHelloIsRefusedBeforeItsPayloadIsRead) {
  // A read request first (no hello): refused.
  EXPECT_FALSE(Attempt(Raw(Frame(nccl_wire::MessageType::kRead, std::string(28, '\0')))).ok());
  // A hello announcing 20 MiB: refused from the header alone (nothing of it was sent).
  EXPECT_EQ(Attempt(Raw(nccl_wire::EncodeHeader(nccl_wire::MessageType::kHello,
                                                nccl_wire::kMaxPayloadBytes)))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  // A hello that does not parse, garbage, and silence.
  EXPECT_EQ(Attempt(Raw(Frame(nccl_wire::MessageType::kHello, "\xff\xff\xff\xff"))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Attempt(Raw("GET / HTTP/1.1\r\n\r\n")).ok());
  EXPECT_EQ(Attempt(Raw("")).status().code(), absl::StatusCode::kDeadlineExceeded);
}

// The reader's half against a source that never challenges, or sends something else first.
TEST_F(AcceptHelloTest, AReaderWaitsForTheChallengeOnly) {
  absl::StatusOr<int> client = nccl_socket::Connect("127.0.0.1", port_, absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  const int served = accept(listen_fd_, nullptr, nullptr);
  EXPECT_EQ(SendHello(*client, "", kIds, stop_, absl::Milliseconds(200)).code(),
            absl::StatusCode::kDeadlineExceeded);
  const std::string ack = Frame(nccl_wire::MessageType::kReadAck, std::string(20, '\0'));
  send(served, ack.data(), ack.size(), MSG_NOSIGNAL);
  EXPECT_FALSE(SendHello(*client, "", kIds, stop_, absl::Seconds(1)).ok());
  close(served);
  close(*client);
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl_auth
