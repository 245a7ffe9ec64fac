// Worker groups served for real: tandem_worker --tp=2 (rank 0 serves and schedules, rank 1 a
// child process it started, both over Gloo on loopback) behind a real tandem_router.
//   * the router lists the worker's group (2 ranks over gloo); greedy tokens equal the TP=1
//     engine's on the golden fixture; SIGTERM drains the whole group (both rank processes exit);
//   * SIGKILL of rank 1 mid-stream: the client gets UNAVAILABLE within 5 s; rank 0 restarts the
//     group in place and the router routes to it again;
//   * prefill and decode groups of TP 2->1, 1->2, 2->2 equal a mixed worker, each D rank holding
//     exactly its heads of the KV, moved in bulk;
//   * a checkpoint pre-sharded for TP=2 serves the same tokens.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

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
  ASSERT_NO_FATAL_FAILURE(ExpectServedTokens(*cluster, prompts, expected));
  worker.process->Signal(SIGTERM);
  const int status = worker.process->Wait(absl::Seconds(20));
  ASSERT_NE(status, -1) << "the worker did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 100 && Alive(ranks[0]); ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(Alive(ranks[0])) << "rank 1 outlived its group";
}

// A checkpoint pre-sharded for TP=2 (shard_checkpoint): each rank reads only its own file, and
// the group still gives the TP=1 engine's tokens; a TP=1 worker refuses it, naming both.
TEST(TpServingE2eTest, PreShardedCheckpointServesTheSameTokens) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 4);
  const auto expected = Reference(prompts);
  const std::string model = Runfile(kModel);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/pre_sharded_tp2_", seed);
  auto config = runtime::LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(runtime::WritePreShardedCheckpoint(model, *config, 2, 1, dir).ok());
  auto cluster = StartCluster(0, 0, 1, {}, {"--tp=2", "--num_threads=1", "--model=" + dir});
  ASSERT_NE(cluster, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectServedTokens(*cluster, prompts, expected));
  auto tp1 = runtime::LoadModelWeights(dir, *config, runtime::TpShard{0, 1});
  EXPECT_EQ(tp1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(tp1.status().message()).find("pre-sharded for tp=2"), std::string::npos)
      << tp1.status();
  cluster.reset();
  std::filesystem::remove_all(dir);
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
  // The broken group cannot run a step again: rank 0 restarts it in place (the same process, a
  // new rank 1; runtime/worker/group_restart.h) and the router routes to it again.
  Prompt q;
  q.ids = {5, 6, 7};
  q.max_tokens = 2;
  Result r;
  for (const absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
    r = Generate(cluster->router(), ToRequest(q), absl::Seconds(10));
    if (r.status.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(r.status.ok()) << r.status.error_message() << cluster->Logs();
  EXPECT_TRUE(worker.process->Running());
  const std::vector<pid_t> now = Children(worker.process->pid());
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], ranks[0]);
}

// P and D groups of any tensor-parallel sizes through the router: each D rank pulls its own KV
// heads from the P ranks that hold them (kvtransfer/rank_reader.h), and the tokens equal a
// mixed worker's; every D rank received exactly its share of the KV, in bulk (descriptors per
// load bounded by source ranks x blocks), read no byte it did not keep (strided reads: direct
// copies over shared memory, gathers at the source over TCP as between hosts), and no load
// failed (no recompute).
TEST(TpServingE2eTest, PrefillAndDecodeGroupsOfAnyTpEqualAMixedWorker) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = RandomPrompts(seed, 5);
  const auto expected = Reference(prompts);
  struct Shape {
    int prefill_tp, decode_tp;
    const char* ucx_tls;
  };
  for (const Shape& shape : {Shape{2, 1, "tcp,self,sm"}, Shape{1, 2, "tcp,self,sm"},
                             Shape{2, 2, "tcp,self,sm"}, Shape{1, 2, "tcp,self"}}) {
    SCOPED_TRACE(testing::Message() << "P TP=" << shape.prefill_tp << " -> D TP=" << shape.decode_tp
                                    << " over " << shape.ucx_tls);
    ClusterOptions options;
    options.model_dir = kModel;
    options.worker_flags = {"--num_threads=1", absl::StrCat("--ucx_tls=", shape.ucx_tls)};
    options.prefill_flags = {absl::StrCat("--tp=", shape.prefill_tp)};
    options.decode_flags = {absl::StrCat("--tp=", shape.decode_tp)};
    auto started = Cluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    Cluster& cluster = **started;
    int handed_off = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Result r = Generate(cluster.router(), ToRequest(prompts[i]));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message() << cluster.Logs();
      EXPECT_EQ(r.tokens, expected[i]) << "prompt " << i;
      handed_off += r.tokens.size() > 1 ? 1 : 0;
    }
    absl::StatusOr<tandem::v1::WorkerStats> stats = cluster.Stats("decode-0");
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->kv_load_failures(), 0u) << cluster.Logs();
    EXPECT_EQ(stats->kv_loads_completed(), static_cast<uint64_t>(handed_off));
    ASSERT_EQ(stats->kv_bytes_received_per_rank_size(), shape.decode_tp);
    uint64_t total_blocks = 0;
    for (const Prompt& p : prompts) total_blocks += (p.ids.size() + 15) / 16;
    for (int r = 0; r < shape.decode_tp; ++r) {
      SCOPED_TRACE(testing::Message() << "D rank " << r);
      // The golden model's 2 KV heads split evenly: every rank keeps the same share.
      EXPECT_GT(stats->kv_bytes_received_per_rank(r), 0u);
      EXPECT_EQ(stats->kv_bytes_received_per_rank(r), stats->kv_bytes_received_per_rank(0));
      EXPECT_EQ(stats->kv_bytes_read_per_rank(r), stats->kv_bytes_received_per_rank(r));
      // Bulk: at most one descriptor per (source rank, block), never per token or head.
      EXPECT_LE(stats->kv_copy_ops_per_rank(r), shape.prefill_tp * total_blocks);
    }
  }
}

// A decode group's rank killed mid-stream: the client gets UNAVAILABLE within 5 s, the prefill
// worker's leases go back to none (the decode group had released them after its load), and the
// group is restarted in place (serving again under a new epoch).
TEST(TpServingE2eTest, KillDecodeRankOneMidStreamFreesThePrefillSide) {
  KillDecodeRankMidStream({"--tp=2"});
}

}  // namespace
}  // namespace tandem::e2e
