// GlooProcessGroup on loopback, one thread per rank (each rank its own store client, Gloo
// device and context, as separate processes would have): every collective against a reference
// computed here on fresh random inputs, for 2, 3 and 4 ranks; and the failure model: a wedged
// rank gives DEADLINE_EXCEEDED, a dead one UNAVAILABLE, a missing one fails the rendezvous, the
// group stays broken after its first error, nothing hangs.
#include "comm/gloo_process_group.h"

#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

GlooGroupOptions Options(int rank, int size, int port, absl::Duration timeout) {
  GlooGroupOptions o;
  o.rank = rank;
  o.world_size = size;
  o.store_port = port;
  o.serve_store = false;  // the test's own server (a launcher's role)
  o.timeout = timeout;
  return o;
}

// Runs body(rank, group) on `size` threads, each with its own group.
void RunRanks(int size, absl::Duration timeout,
              const std::function<void(int, GlooProcessGroup&)>& body) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto group = GlooProcessGroup::Create(Options(r, size, (*server)->port(), timeout));
      ASSERT_TRUE(group.ok()) << "rank " << r << ": " << group.status();
      body(r, **group);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooProcessGroupTest, CollectivesMatchAReference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << size << " ranks");
    std::mt19937 rng(seed + size);
    const int n = 1 + static_cast<int>(rng() % 300);
    // Inputs per rank, and the all-to-all counts matrix (counts[i][j]: i sends to j).
    std::vector<std::vector<float>> inputs(size, std::vector<float>(n));
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (auto& in : inputs) {
      for (float& v : in) v = value(rng);
    }
    std::vector<std::vector<int64_t>> counts(size, std::vector<int64_t>(size));
    for (auto& row : counts) {
      for (int64_t& c : row) c = rng() % 6;  // uneven, zeros included
    }
    const int root = static_cast<int>(rng() % size);
    std::string plan(1 + rng() % 1000, '\0');
    for (char& c : plan) c = static_cast<char>(rng());

    RunRanks(size, absl::Seconds(30), [&](int rank, GlooProcessGroup& group) {
      EXPECT_EQ(group.rank(), rank);
      EXPECT_EQ(group.size(), size);
      // all-reduce
      std::vector<float> data = inputs[rank];
      ASSERT_TRUE(group.AllReduceSum(absl::MakeSpan(data)).ok());
      for (int i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += inputs[r][i];
        EXPECT_NEAR(data[i], want, 1e-5) << "all-reduce element " << i;
      }
      // all-gather
      std::vector<float> gathered(static_cast<size_t>(n) * size);
      ASSERT_TRUE(group.AllGather(inputs[rank], absl::MakeSpan(gathered)).ok());
      for (int r = 0; r < size; ++r) {
        for (int i = 0; i < n; ++i) EXPECT_EQ(gathered[r * n + i], inputs[r][i]);
      }
      // broadcast
      std::string got = rank == root ? plan : std::string(plan.size(), 'x');
      ASSERT_TRUE(group.Broadcast(absl::MakeSpan(got.data(), got.size()), root).ok());
      EXPECT_EQ(got, plan);
      // all-to-all with uneven splits: rank i's part for j is values 1000*i + 100*j + k.
      std::vector<float> send;
      std::vector<int64_t> send_counts(size), recv_counts(size);
      for (int j = 0; j < size; ++j) {
        send_counts[j] = counts[rank][j];
        recv_counts[j] = counts[j][rank];
        for (int64_t k = 0; k < counts[rank][j]; ++k) send.push_back(1000.0f * rank + 100 * j + k);
      }
      int64_t total = 0;
      for (int64_t c : recv_counts) total += c;
      std::vector<float> received(total);
      ASSERT_TRUE(group.AllToAll(send, send_counts, absl::MakeSpan(received), recv_counts).ok());
      size_t at = 0;
      for (int j = 0; j < size; ++j) {
        for (int64_t k = 0; k < counts[j][rank]; ++k) {
          EXPECT_EQ(received[at++], 1000.0f * j + 100 * rank + k) << "from " << j;
        }
      }
      // reduce-scatter: rank r gets the sum of everyone's r-th part.
      std::vector<float> scattered(n);
      std::vector<float> rs_in(static_cast<size_t>(n) * size);
      for (int i = 0; i < n * size; ++i) rs_in[i] = inputs[rank][i % n] * (1 + i / n);
      ASSERT_TRUE(group.ReduceScatterSum(rs_in, absl::MakeSpan(scattered)).ok());
      for (int i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += inputs[r][i] * (1 + rank);
        EXPECT_NEAR(scattered[i], want, 1e-5) << "reduce-scatter element " << i;
      }
      // send/recv around a ring, twice (sequence numbers), between two collectives that must
      // still match on every rank.
      for (int round = 0; round < 2; ++round) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        std::vector<float> mine(n + round), theirs(n + round, -1.0f);
        for (int i = 0; i < n + round; ++i) mine[i] = 10.0f * rank + i + 0.5f * round;
        if (rank % 2 == 0) {
          ASSERT_TRUE(group.Send(mine, next).ok());
          ASSERT_TRUE(group.Recv(absl::MakeSpan(theirs), prev).ok());
        } else {
          ASSERT_TRUE(group.Recv(absl::MakeSpan(theirs), prev).ok());
          ASSERT_TRUE(group.Send(mine, next).ok());
        }
        for (int i = 0; i < n + round; ++i) EXPECT_EQ(theirs[i], 10.0f * prev + i + 0.5f * round);
      }
      EXPECT_FALSE(group.Send(data, rank).ok()) << "a send to itself is refused";
      EXPECT_TRUE(group.Barrier().ok());
      EXPECT_TRUE(group.status().ok());
    });
  }
}

// Collectives of nothing (a chunked prefill step samples no row, so a TP group gathers 0
// logits on every rank): each returns OK at once on every rank, and the group's next collective
// still matches (no tag skipped on one rank only). Gloo's own all-gather divides by the input
// size: before, 0 floats killed every rank of the group with SIGFPE.
TEST(GlooProcessGroupTest, CollectivesOfNothingAreNoOpsAndTheGroupGoesOn) {
  for (int size : {2, 3}) {
    SCOPED_TRACE(testing::Message() << size << " ranks");
    RunRanks(size, absl::Seconds(10), [&](int rank, GlooProcessGroup& group) {
      const std::vector<float> none;
      std::vector<float> out;
      EXPECT_TRUE(group.AllGather(none, absl::MakeSpan(out)).ok());
      EXPECT_TRUE(group.AllReduceSum(absl::MakeSpan(out)).ok());
      EXPECT_TRUE(group.ReduceScatterSum(none, absl::MakeSpan(out)).ok());
      const std::vector<int64_t> zeros(size, 0);
      EXPECT_TRUE(group.AllToAll(none, zeros, absl::MakeSpan(out), zeros).ok());
      std::vector<float> data(5, static_cast<float>(rank + 1));
      ASSERT_TRUE(group.AllReduceSum(absl::MakeSpan(data)).ok());
      EXPECT_EQ(data[4], size * (size + 1) / 2.0f);
      EXPECT_TRUE(group.status().ok());
    });
  }
}

TEST(GlooProcessGroupTest, WedgedRankGivesDeadlineExceededAndTheGroupStaysBroken) {
  absl::Notification done;
  std::atomic<int> deadline_errors{0};
  std::atomic<int> finished{0};
  RunRanks(3, absl::Seconds(1), [&](int rank, GlooProcessGroup& group) {
    if (rank == 2) {  // alive, connected, but never joins the collective
      done.WaitForNotificationWithTimeout(absl::Seconds(20));
      return;
    }
    std::vector<float> data(64, 1.0f);
    const absl::Status s = group.AllReduceSum(absl::MakeSpan(data));
    EXPECT_FALSE(s.ok());
    if (s.code() == absl::StatusCode::kDeadlineExceeded) ++deadline_errors;
    // Broken from here on: at once, with the first error.
    EXPECT_EQ(group.Barrier().code(), s.code());
    EXPECT_EQ(group.status().code(), s.code());
    if (++finished == 2) done.Notify();
  });
  EXPECT_GE(deadline_errors.load(), 1) << "a wedged peer is a timeout";
}

TEST(GlooProcessGroupTest, DeadRankGivesUnavailableBeforeTheDeadline) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  absl::Notification both_up;
  std::atomic<int> up{0};
  absl::Status survivor;
  absl::Duration waited;
  std::thread dead([&] {
    auto group = GlooProcessGroup::Create(Options(1, 2, (*server)->port(), absl::Seconds(30)));
    ASSERT_TRUE(group.ok()) << group.status();
    if (++up == 2) both_up.Notify();
    both_up.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(200));
    // Dies: its connections close (as with kill -9, minus the process).
  });
  std::thread alive([&] {
    auto group = GlooProcessGroup::Create(Options(0, 2, (*server)->port(), absl::Seconds(30)));
    ASSERT_TRUE(group.ok()) << group.status();
    if (++up == 2) both_up.Notify();
    both_up.WaitForNotification();
    std::vector<float> data(1024, 1.0f);
    const absl::Time start = absl::Now();
    survivor = (*group)->AllReduceSum(absl::MakeSpan(data));
    waited = absl::Now() - start;
  });
  dead.join();
  alive.join();
  EXPECT_EQ(survivor.code(), absl::StatusCode::kUnavailable) << survivor;
  EXPECT_LT(waited, absl::Seconds(20)) << "a closed peer must not cost the whole deadline";
}

TEST(GlooProcessGroupTest, MissingRankFailsTheRendezvousAndBadArgumentsAreRefused) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto alone = GlooProcessGroup::Create(Options(0, 2, (*server)->port(), absl::Seconds(1)));
  ASSERT_FALSE(alone.ok());
  EXPECT_TRUE(alone.status().code() == absl::StatusCode::kDeadlineExceeded ||
              alone.status().code() == absl::StatusCode::kUnavailable)
      << alone.status();
  EXPECT_EQ(
      GlooProcessGroup::Create(Options(2, 2, (*server)->port(), absl::Seconds(1))).status().code(),
      absl::StatusCode::kInvalidArgument);
  auto single = GlooProcessGroup::Create(Options(0, 1, (*server)->port(), absl::Seconds(5)));
  ASSERT_TRUE(single.ok()) << single.status();
  std::vector<float> in = {1, 2, 3}, out(2);
  EXPECT_EQ((*single)->AllGather(in, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> counts = {2};
  EXPECT_EQ((*single)->AllToAll(in, counts, absl::MakeSpan(out), counts).code(),
            absl::StatusCode::kInvalidArgument);
}

// Startup meeting (issue 31 item 1): a late rank is named in the progress reports of the ranks
// waiting for it, everyone then meets; a rank that never comes fails the wait at the limit,
// named, and the group's collectives still work afterwards (the store, not Gloo, was used).
TEST(GlooProcessGroupTest, MeetWithProgressNamesTheLateRank) {
  RunRanks(3, absl::Seconds(20), [](int rank, GlooProcessGroup& group) {
    if (rank == 2) absl::SleepFor(absl::Milliseconds(600));
    std::vector<std::vector<int>> reports;
    const absl::Status met = group.MeetWithProgress(
        "loaded", absl::Seconds(20), absl::Milliseconds(100),
        [&](const std::vector<int>& missing, absl::Duration) { reports.push_back(missing); });
    EXPECT_TRUE(met.ok()) << met;
    if (rank != 2) {
      ASSERT_FALSE(reports.empty()) << "rank " << rank;
      EXPECT_EQ(reports.back(), std::vector<int>{2}) << "rank " << rank;
    }
    // Only rank 0 and 1 meet again; rank 2 stays away: they give up at the limit, naming it.
    if (rank != 2) {
      const absl::Status late =
          group.MeetWithProgress("again", absl::Milliseconds(300), absl::Milliseconds(100),
                                 [](const std::vector<int>&, absl::Duration) {});
      EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
      EXPECT_NE(late.message().find("rank(s) 2 did not arrive"), absl::string_view::npos) << late;
    }
    std::vector<float> one = {1.0f};
    EXPECT_TRUE(group.AllReduceSum(absl::MakeSpan(one)).ok());
    EXPECT_EQ(one[0], 3.0f);
  });
}

TEST(TcpStoreTest, SetGetWaitAndTimeouts) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto a = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), absl::Seconds(5));
  auto b = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), absl::Seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE((*b)->Set("k", std::string("v\0w", 3), absl::Seconds(5)).ok());
  });
  absl::StatusOr<std::string> got = (*a)->Get("k", absl::Seconds(10));  // waits for the set
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("v\0w", 3));
  EXPECT_TRUE((*a)->Wait({"k"}, absl::Seconds(1)).ok());
  EXPECT_EQ((*a)->Get("never", absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*a)->Wait({"k", "never"}, absl::Milliseconds(200)).code(),
            absl::StatusCode::kDeadlineExceeded);
  // A server that went away: an error, not a hang.
  server->reset();
  EXPECT_FALSE((*a)->Get("k", absl::Seconds(1)).ok());
  EXPECT_EQ(TcpStoreClient::Connect("127.0.0.1", 1, absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace tandem::comm
