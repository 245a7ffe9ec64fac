// ShmCommandLine (shm_command_line.h): commands arrive in order in other processes, a command
// larger than the slot goes over the group and keeps the group's collectives in step, a follower
// that hears nothing fails DEADLINE_EXCEEDED at its deadline (and rank 0 likewise when a follower
// stops taking commands), a follower whose rank 0 is gone fails UNAVAILABLE, and no segment is
// ever left in /dev/shm.
#include "runtime/parallel/shm_command_line.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/no_collectives_group.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

tandem::v1::RankCommand Step(int id, size_t padding = 0) {
  tandem::v1::RankCommand c;
  tandem::v1::PlannedSeq* seq = c.mutable_step()->add_seqs();
  seq->set_request_id(id);
  for (size_t i = 0; i < padding; ++i) seq->add_new_tokens(static_cast<int32_t>(i));
  return c;
}

int PlanSegmentsInDevShm() {
  int n = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, "tandem-plan-")) ++n;
  }
  closedir(dir);
  return n;
}

TEST(ShmCommandLineTest, CommandsArriveInOrderInOtherProcesses) {
  constexpr int kRanks = 4;
  constexpr int kCommands = 2000;
  auto segment = PlanSegment::Create(kRanks);
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::vector<pid_t> children;
  for (int r = 1; r < kRanks; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // fork keeps the descriptor (close-on-exec only matters for exec).
      auto mine = PlanSegment::Attach(dup((*segment)->fd()));
      if (!mine.ok()) _exit(2);
      comm::NoCollectivesGroup group(r, kRanks);
      ShmCommandLine line(mine->get(), &group, absl::Seconds(10));
      for (int i = 0; i < kCommands; ++i) {
        auto c = line.Receive();
        if (!c.ok() || c->step().seqs(0).request_id() != i) _exit(3);
      }
      auto last = line.Receive();
      _exit(last.ok() && last->shutdown() ? 0 : 4);
    }
    children.push_back(pid);
  }
  comm::NoCollectivesGroup group(0, kRanks);
  ShmCommandLine line(segment->get(), &group, absl::Seconds(10));
  for (int i = 0; i < kCommands; ++i) ASSERT_TRUE(line.Send(Step(i, i % 50)).ok());
  tandem::v1::RankCommand shutdown;
  shutdown.set_shutdown(true);
  ASSERT_TRUE(line.Send(shutdown).ok());
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_EQ(PlanSegmentsInDevShm(), 0);
}

// A command over the slot goes over the group's broadcast; the small ones around it and the
// group's own collectives afterwards stay in step.
TEST(ShmCommandLineTest, LargeCommandFallsBackToTheGroup) {
  constexpr int kRanks = 3;
  auto segment = PlanSegment::Create(kRanks);
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const size_t big = kPlanSlotBytes;  // ~4-5 bytes a token: well over the slot
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooGroupOptions o;
      o.rank = r;
      o.world_size = kRanks;
      o.store_port = (*server)->port();
      o.serve_store = false;
      o.timeout = absl::Seconds(10);
      auto group = comm::GlooProcessGroup::Create(o);
      ASSERT_TRUE(group.ok()) << group.status();
      std::unique_ptr<PlanSegment> attached;
      if (r > 0) {
        auto a = PlanSegment::Attach(dup((*segment)->fd()));
        ASSERT_TRUE(a.ok()) << a.status();
        attached = *std::move(a);
      }
      ShmCommandLine line(r == 0 ? segment->get() : attached.get(), group->get(),
                          absl::Seconds(10));
      for (int i = 0; i < 5; ++i) {
        const size_t padding = i == 2 ? big : 10;
        if (r == 0) {
          ASSERT_TRUE(line.Send(Step(i, padding)).ok());
        } else {
          auto c = line.Receive();
          ASSERT_TRUE(c.ok()) << c.status();
          EXPECT_EQ(c->step().seqs(0).request_id(), i);
          EXPECT_EQ(c->step().seqs(0).new_tokens_size(), static_cast<int>(padding));
        }
        float one = 1.0f;
        ASSERT_TRUE((*group)->AllReduceSum(absl::MakeSpan(&one, 1)).ok());
        EXPECT_EQ(one, static_cast<float>(kRanks));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(ShmCommandLineTest, FollowerFailsAtItsDeadlineWhenRankZeroStopsWriting) {
  auto segment = PlanSegment::Create(2);
  ASSERT_TRUE(segment.ok()) << segment.status();
  comm::NoCollectivesGroup leader_group(0, 2), follower_group(1, 2);
  ShmCommandLine leader(segment->get(), &leader_group, absl::Seconds(10));
  ShmCommandLine follower(segment->get(), &follower_group, absl::Milliseconds(300));
  ASSERT_TRUE(leader.Send(Step(0)).ok());
  ASSERT_TRUE(follower.Receive().ok());
  const absl::Time start = absl::Now();
  auto c = follower.Receive();
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_GE(waited, absl::Milliseconds(290));
  EXPECT_LT(waited, absl::Seconds(3));
  EXPECT_EQ(follower.status().code(), absl::StatusCode::kDeadlineExceeded);  // broken for good
  EXPECT_EQ(follower.Receive().status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ShmCommandLineTest, RankZeroFailsAtItsDeadlineWhenAFollowerStopsTaking) {
  auto segment = PlanSegment::Create(3);
  ASSERT_TRUE(segment.ok()) << segment.status();
  comm::NoCollectivesGroup leader_group(0, 3), group1(1, 3), group2(2, 3);
  ShmCommandLine leader(segment->get(), &leader_group, absl::Milliseconds(300));
  ShmCommandLine follower1(segment->get(), &group1, absl::Seconds(10));
  ShmCommandLine follower2(segment->get(), &group2, absl::Seconds(10));
  ASSERT_TRUE(leader.Send(Step(0)).ok());
  ASSERT_TRUE(follower1.Receive().ok());  // rank 2 never takes it
  const absl::Time start = absl::Now();
  absl::Status s = leader.Send(Step(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(leader.status().ok());
}

// A follower that exited (rank 0 started it and has not reaped it: a zombie, whose pid still
// answers kill(0)) fails rank 0's next wait for its ack UNAVAILABLE at once, not at the deadline.
TEST(ShmCommandLineTest, RankZeroNoticesAFollowerExited) {
  auto segment = PlanSegment::Create(2);
  ASSERT_TRUE(segment.ok()) << segment.status();
  comm::NoCollectivesGroup leader_group(0, 2);
  ShmCommandLine leader(segment->get(), &leader_group, absl::Seconds(30));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    comm::NoCollectivesGroup group(1, 2);
    ShmCommandLine follower(segment->get(), &group, absl::Seconds(30));
    _exit(follower.Receive().ok() ? 0 : 1);  // takes one command, then exits
  }
  ASSERT_TRUE(leader.Send(Step(0)).ok());
  ASSERT_TRUE(leader.Send(Step(1)).ok());  // waits for the child's ack of step 0
  const absl::Time start = absl::Now();
  const absl::Status s = leader.Send(Step(2));  // step 1 is never taken: the child exited
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // still ours to reap: WNOWAIT left it
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(ShmCommandLineTest, FollowerNoticesRankZeroGone) {
  auto segment = PlanSegment::Create(2);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  (*segment)->layout()->leader_pid = gone;  // as if rank 0 had died without a word
  comm::NoCollectivesGroup group(1, 2);
  ShmCommandLine follower(segment->get(), &group, absl::Seconds(30));
  const absl::Time start = absl::Now();
  auto c = follower.Receive();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ShmCommandLineTest, SegmentNeverListedAndRefusedWhenForeign) {
  const int before = PlanSegmentsInDevShm();
  {
    auto segment = PlanSegment::Create(4);
    ASSERT_TRUE(segment.ok()) << segment.status();
    EXPECT_EQ(PlanSegmentsInDevShm(), before);  // unlinked at creation
    EXPECT_NE(fcntl((*segment)->fd(), F_GETFD) & FD_CLOEXEC, 0);
  }
  EXPECT_EQ(PlanSegmentsInDevShm(), before);
  EXPECT_FALSE(PlanSegment::Create(1).ok());
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_FALSE(PlanSegment::Attach(pipe_fds[0]).ok());
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace tandem::runtime
