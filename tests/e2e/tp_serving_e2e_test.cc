// Worker groups served for real: tandem_worker --tp=2 (rank 0 serves and schedules, rank 1 a
// child process it started, both over Gloo on loopback) behind a real tandem_router.
//   * the router lists the worker's group (2 ranks over gloo); greedy tokens equal the TP=1
//     engine's on the golden fixture; SIGTERM drains the whole group (both rank processes exit);
//   * SIGKILL of rank 1 mid-stream: the client gets UNAVAILABLE within 5 s, the worker reports
//     NOT_SERVING and the router stops routing to it;
//   * --role=prefill with --tp=2 is refused at startup (KV transfer between groups is not built).
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

// The processes whose parent is `parent` (from /proc/PID/stat).
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* entry = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces; split after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
    pid_t ppid = 0;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) && ppid == parent) {
      out.push_back(pid);
    }
  }
  closedir(proc);
  return out;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST(TpServingE2eTest, Tp2MixedWorkerEqualsTp1AndDrainsTheGroup) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 8);
  const auto expected = Reference(prompts);
  auto cluster = StartCluster(0, 0, 1, {}, {"--tp=2", "--num_threads=1"});
  ASSERT_NE(cluster, nullptr);
  WorkerHandle& worker = cluster->workers()[0];
  const std::vector<pid_t> ranks = Children(worker.process->pid());
  ASSERT_EQ(ranks.size(), 1u) << "rank 1 runs as the worker's child";
  {  // The router shows the group.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    tandem::v1::ListWorkersResponse list;
    ASSERT_TRUE(cluster->router().ListWorkers(&ctx, tandem::v1::ListWorkersRequest(), &list).ok());
    ASSERT_EQ(list.workers_size(), 1);
    EXPECT_EQ(list.workers(0).info().group().size(), 2u);
    EXPECT_EQ(list.workers(0).info().group().backend(), "gloo");
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result r = Generate(cluster->router(), ToRequest(prompts[i]));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << cluster->Logs();
    EXPECT_EQ(r.tokens, expected[i]) << "prompt " << i;
  }
  worker.process->Signal(SIGTERM);
  const int status = worker.process->Wait(absl::Seconds(20));
  ASSERT_NE(status, -1) << "the worker did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 100 && Alive(ranks[0]); ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(Alive(ranks[0])) << "rank 1 outlived its group";
}

TEST(TpServingE2eTest, KillRankOneMidStream) {
  auto cluster = StartSlowCluster(0, 0, 1, {"--tp=2", "--num_threads=1"});
  ASSERT_NE(cluster, nullptr);
  WorkerHandle& worker = cluster->workers()[0];
  const std::vector<pid_t> ranks = Children(worker.process->pid());
  ASSERT_EQ(ranks.size(), 1u);
  const Prompt p = LongPrompt();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = cluster->router().Generate(&ctx, ToRequest(p));
  tandem::v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(reader->Read(&msg));  // decoding
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(ranks[0], SIGKILL), 0);
  while (reader->Read(&msg)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "the error must come within seconds";
  // The group cannot run a step again: the worker says NOT_SERVING, the router drops it.
  EXPECT_TRUE(cluster->WaitHealthy(0, absl::Seconds(10)).ok()) << cluster->Logs();
  Prompt q;
  q.ids = {5, 6, 7};
  q.max_tokens = 2;
  Result r = Generate(cluster->router(), ToRequest(q), absl::Seconds(10));
  EXPECT_FALSE(r.status.ok()) << "no healthy worker is left";
}

TEST(TpServingE2eTest, PrefillGroupIsRefusedAtStartup) {
  const std::string log = absl::StrCat(::testing::TempDir(), "/tp_prefill.log");
  auto worker = Process::Spawn(
      {Runfile("runtime/tandem_worker"), "--role=prefill", "--tp=2", "--num_threads=1",
       absl::StrCat("--model=", Runfile(kModel)), "--listen=127.0.0.1:0"},
      log);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const int status = (*worker)->Wait(absl::Seconds(30));
  ASSERT_NE(status, -1) << (*worker)->LogTail();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE((*worker)->LogTail().find("KV transfer between worker groups"), std::string::npos)
      << (*worker)->LogTail();
}

}  // namespace
}  // namespace tandem::e2e
