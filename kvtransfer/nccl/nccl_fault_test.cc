// NcclAgent against hand-played peers in this process that speak the control protocol
// (nccl_agent_wire.h) but never join NCCL: a source that never joins the communicator, one that
// hangs up after the hello, and a reader that never joins (the agent as source). None may hang
// the agent: each ends with an error within its configured deadline. Needs 1 GPU. (A source
// that acks and then stalls mid-transfer runs in a child process: nccl_two_process_test.)
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_auth.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer {
namespace {

using nccl_wire::MessageType;

// Generous bound on "ends within its deadline": the deadlines below are 2 s, the slack covers
// NCCL's abort and a loaded machine. The tests prove "no hang", not speed.
constexpr absl::Duration kSlack = absl::Seconds(20);

// Base of the hand-played peers: a loopback listener, one accepted connection, a thread.
class FakePeer {
 public:
  virtual ~FakePeer() { Join(); }
  absl::Status Listen() {
    absl::StatusOr<int> fd = nccl_socket::Listen("127.0.0.1", 0, &port_);
    if (!fd.ok()) return fd.status();
    listen_fd_ = *fd;
    thread_ = std::thread([this] {
      const int conn = Accept();
      if (conn < 0) return;
      Run(conn);
      close(conn);
    });
    return absl::OkStatus();
  }
  tandem::v1::TransferHandshake descriptor() const {
    tandem::v1::TransferHandshake desc;
    desc.set_transport("nccl");
    desc.set_worker_address(nccl_wire::FormatAddress("127.0.0.1", port_));
    return desc;
  }
  void Join() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
  }

 protected:
  virtual void Run(int conn) = 0;
  void HoldUntilStopped() {
    while (!stop_.load()) absl::SleepFor(absl::Milliseconds(1));
  }
  std::atomic<bool> stop_{false};

 private:
  int Accept() {
    while (!stop_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 10) > 0) return accept(listen_fd_, nullptr, nullptr);
    }
    return -1;
  }
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Challenges the reader (as a source does), reads its hello, then hangs up at once or holds the
// connection without joining NCCL.
class NeverJoiningSource : public FakePeer {
 public:
  explicit NeverJoiningSource(bool hang_up) : hang_up_(hang_up) {}
  ~NeverJoiningSource() override { Join(); }

 private:
  void Run(int conn) override {
    MessageType type;
    std::string payload;
    const std::string challenge(nccl_wire::kChallengeBytes, 'c');
    if (!nccl_socket::SendFrame(conn, MessageType::kChallenge, challenge).ok()) return;
    if (!nccl_socket::RecvFrame(conn, stop_, absl::Seconds(30), &type, &payload).ok()) return;
    if (!hang_up_) HoldUntilStopped();
  }
  const bool hang_up_;
};

NcclAgentOptions ShortDeadlines() {
  NcclAgentOptions o;
  o.device = 0;
  o.init_timeout = absl::Seconds(2);
  o.transfer_timeout = absl::Seconds(2);
  return o;
}

TEST(NcclFaultTest, AddPeerGivesUpWhenThePeerNeverJoins) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int comms : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "num_comms " << comms);
    NcclAgentOptions options = ShortDeadlines();
    options.num_comms = comms;
    auto agent = NcclAgent::Create(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    NeverJoiningSource silent(/*hang_up=*/false);
    ASSERT_TRUE(silent.Listen().ok());
    const absl::Time start = absl::Now();
    absl::Status s = (*agent)->AddPeer("silent", silent.descriptor());
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_LT(took, absl::Seconds(2) + kSlack) << s;
    EXPECT_EQ((*agent)->PostRead("silent", {{0, 0, 0, 0, 1}}).status().code(),
              absl::StatusCode::kNotFound);
  }
}

TEST(NcclFaultTest, AddPeerFailsWhenThePeerHangsUpBeforeJoining) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto agent = NcclAgent::Create(ShortDeadlines());
  ASSERT_TRUE(agent.ok()) << agent.status();
  NeverJoiningSource quitter(/*hang_up=*/true);
  ASSERT_TRUE(quitter.Listen().ok());
  absl::Status s = (*agent)->AddPeer("quitter", quitter.descriptor());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

// The agent as source: a "reader" sends a hello with fresh ncclUniqueIds (1 or 2 communicators)
// and never joins. The agent must give up after init_timeout and close the connection (not pin
// its serving thread).
TEST(NcclFaultTest, SourceDropsAReaderThatNeverJoins) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int comms : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "communicators " << comms);
    auto agent = NcclAgent::Create(ShortDeadlines());
    ASSERT_TRUE(agent.ok()) << agent.status();
    std::string host;
    int port = 0;
    ASSERT_TRUE(nccl_wire::ParseAddress((*agent)->control_address(), &host, &port).ok());
    absl::StatusOr<int> fd = nccl_socket::Connect(host, port, absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status();
    std::vector<ncclUniqueId> ids(comms);
    for (ncclUniqueId& id : ids) ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::atomic<bool> stop{false};
    ASSERT_TRUE(nccl_auth::SendHello(*fd, "",
                                     absl::string_view(reinterpret_cast<const char*>(ids.data()),
                                                       ids.size() * sizeof(ids[0])),
                                     stop, absl::Seconds(5))
                    .ok());
    MessageType type;
    std::string payload;
    const absl::Time start = absl::Now();
    absl::Status s = nccl_socket::RecvFrame(*fd, stop, absl::Seconds(2) + kSlack, &type, &payload);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "the agent kept the connection: " << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2) + kSlack);
    close(*fd);
    agent->reset();  // returns: no thread is stuck in NCCL init
  }
}

// The agent as source with a control token key: a hello without a token, or with one it did not
// issue, is dropped at once (NCCL never starts); one proving a token it issued gets to NCCL's
// init (and is dropped only when the reader never joins, after init_timeout), on every
// connection of the token's lifetime.
TEST(NcclFaultTest, SourceAcceptsOnlyConnectionsWithATokenItIssued) {
  TANDEM_SKIP_WITHOUT_GPU();
  NcclAgentOptions options = ShortDeadlines();
  options.init_timeout = absl::Seconds(4);
  options.control_token_key = std::string(32, 'k');
  auto agent = NcclAgent::Create(options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::string host;
  int port = 0;
  ASSERT_TRUE(nccl_wire::ParseAddress((*agent)->control_address(), &host, &port).ok());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const absl::string_view ids(reinterpret_cast<const char*>(&id), sizeof(id));
  // Sends a hello with `token`; whether the agent still holds the connection after 1 s.
  auto held = [&](const std::string& token) {
    absl::StatusOr<int> fd = nccl_socket::Connect(host, port, absl::Seconds(5));
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return false;
    std::atomic<bool> stop{false};
    EXPECT_TRUE(nccl_auth::SendHello(*fd, token, ids, stop, absl::Seconds(5)).ok());
    const absl::Status waited = nccl_socket::WaitReadable(*fd, stop, absl::Seconds(1));
    const bool open = absl::IsDeadlineExceeded(waited) && nccl_socket::CheckOpen(*fd).ok();
    close(*fd);
    return open;
  };
  EXPECT_FALSE(held("")) << "no token";
  EXPECT_FALSE(held(std::string(nccl_auth::kTokenBytes, 'x'))) << "a forged token";
  nccl_auth::ControlTokenAuthority stranger(std::string(32, 's'));
  EXPECT_FALSE(held(stranger.Issue())) << "another worker's token";
  const std::string token = (*agent)->IssueAccessToken();
  ASSERT_EQ(token.size(), nccl_auth::kTokenBytes);
  EXPECT_TRUE(held(token)) << "a token it issued reaches NCCL's init";
  EXPECT_TRUE(held(token)) << "and does so for a second reader rank";
  agent->reset();  // returns: the half-joined connection is dropped
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  // A hang is a failure, not a stuck CI job: SIGALRM ends the process.
  alarm(120);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
