#include "tests/e2e/serving_util.h"

#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"

namespace tandem::e2e {

Prompt LongPrompt(int max_tokens) {
  Prompt p;
  for (int i = 0; i < 30; ++i) p.ids.push_back(20 + i);
  p.max_tokens = max_tokens;
  return p;
}

tandem::v1::GenerateRequest ToRequest(const Prompt& p) {
  tandem::v1::GenerateRequest r;
  for (uint32_t t : p.ids) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_tokens(p.max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

Result Generate(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
                absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = router.Generate(&ctx, request);
  Result out;
  tandem::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      out.finish = msg.finish_reason();
      out.usage = msg.usage();
    }
  }
  out.status = reader->Finish();
  return out;
}

void ExpectServedTokens(Cluster& cluster, const std::vector<Prompt>& prompts,
                        const std::vector<std::vector<uint32_t>>& expected) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result r = Generate(cluster.router(), ToRequest(prompts[i]));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << cluster.Logs();
    EXPECT_EQ(r.tokens, expected[i]) << "prompt " << i;
  }
}

// Greedy reference: the engine in this process on the same model files.
std::vector<std::vector<uint32_t>> Reference(const std::vector<Prompt>& prompts) {
  runtime::ModelSource source;
  source.model_dir = Runfile(kModel);
  auto model = runtime::LoadModel(source);
  EXPECT_TRUE(model.ok()) << model.status();
  runtime::EngineConfig config;
  config.num_threads = 1;
  config.kv_cache_bytes = 16 << 20;
  auto engine = runtime::Engine::Create(config, model->config, std::move(model->weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    runtime::RequestSpec spec;
    spec.prompt.assign(prompts[i].ids.begin(), prompts[i].ids.end());
    spec.max_tokens = prompts[i].max_tokens;
    spec.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), spec).ok());
  }
  std::vector<std::vector<uint32_t>> out(prompts.size());
  while ((*engine)->HasUnfinished()) {
    auto updates = (*engine)->Step();
    EXPECT_TRUE(updates.ok());
    if (!updates.ok()) break;
    for (auto& u : *updates) {
      out[u.request_id].insert(out[u.request_id].end(), u.new_token_ids.begin(),
                               u.new_token_ids.end());
    }
  }
  return out;
}

std::vector<Prompt> RandomPrompts(uint32_t seed, int n, int max_len) {
  std::mt19937 rng(seed);
  std::vector<Prompt> prompts(n);
  for (Prompt& p : prompts) {
    const int len = 1 + static_cast<int>(rng() % max_len);
    for (int i = 0; i < len; ++i) p.ids.push_back(3 + rng() % 500);
    p.max_tokens = 2 + static_cast<int>(rng() % 12);
  }
  return prompts;
}

std::unique_ptr<Cluster> StartCluster(int prefill, int decode, int mixed,
                                      std::vector<std::string> router_flags,
                                      std::vector<std::string> worker_flags) {
  ClusterOptions options;
  options.prefill = prefill;
  options.decode = decode;
  options.mixed = mixed;
  options.model_dir = kModel;
  options.router_flags = std::move(router_flags);
  options.worker_flags = std::move(worker_flags);
  auto cluster = Cluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::unique_ptr<Cluster> StartSlowCluster(int prefill, int decode, int mixed,
                                          std::vector<std::string> extra_flags) {
  ClusterOptions options;
  options.prefill = prefill;
  options.decode = decode;
  options.mixed = mixed;
  options.dummy_config = "llama-100m";
  options.worker_flags = {"--kv_cache_bytes=134217728"};
  options.worker_flags.insert(options.worker_flags.end(), extra_flags.begin(), extra_flags.end());
  auto started = Cluster::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? std::move(*started) : nullptr;
}

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

void KillDecodeRankMidStream(std::vector<std::string> decode_flags) {
  ClusterOptions options;
  options.dummy_config = "llama-100m";
  options.worker_flags = {"--kv_cache_bytes=134217728", "--num_threads=1"};
  options.decode_flags = std::move(decode_flags);
  auto started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  WorkerHandle* decode = cluster.worker("decode-0");
  ASSERT_NE(decode, nullptr);
  const std::vector<pid_t> ranks = Children(decode->process->pid());
  ASSERT_EQ(ranks.size(), 1u);
  absl::StatusOr<tandem::v1::WorkerStats> before = cluster.Stats("decode-0");
  ASSERT_TRUE(before.ok()) << before.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = cluster.router().Generate(&ctx, ToRequest(LongPrompt()));
  tandem::v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(reader->Read(&msg));  // decoding on the group: its KV came from prefill-0
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(ranks[0], SIGKILL), 0);
  while (reader->Read(&msg)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "the error must come within seconds";
  absl::StatusOr<tandem::v1::WorkerStats> prefill = cluster.Stats("prefill-0");
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->load().kv_blocks_leased(), 0u) << "the prefill side holds nothing";
  // The group restarts in place (runtime/worker/group_restart.h): a new epoch, serving again.
  absl::StatusOr<tandem::v1::WorkerStats> stats;
  for (const absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
    stats = cluster.Stats("decode-0", /*wait_for_ready=*/true);
    if (stats.ok() && stats->info().epoch() > before->info().epoch() &&
        stats->status() == tandem::v1::SERVING_STATUS_SERVING) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(stats.ok()) << stats.status() << cluster.Logs();
  EXPECT_GT(stats->info().epoch(), before->info().epoch()) << cluster.Logs();
  EXPECT_EQ(stats->status(), tandem::v1::SERVING_STATUS_SERVING);
}

void ExpectFp8KvRunsEqualTheMixedWorker(const std::string& model_dir,
                                        const std::vector<Fp8KvRun>& runs) {
  std::ifstream in(model_dir + "/expected.json"), config_in(model_dir + "/config.json");
  ASSERT_TRUE(in.good() && config_in.good());
  const auto prompts =
      nlohmann::json::parse(in)["prompts"].get<std::vector<std::vector<uint32_t>>>();
  const nlohmann::json config = nlohmann::json::parse(config_in);
  const bool latent = config.contains("kv_lora_rank");
  const uint64_t layer_bytes =  // a token's, one layer, whole
      latent
          ? config["kv_lora_rank"].get<uint64_t>() + config["qk_rope_head_dim"].get<uint64_t>() + 4
          : 2 * config["num_key_value_heads"].get<uint64_t>() *
                (config.contains("head_dim") && !config["head_dim"].is_null()
                     ? config["head_dim"].get<uint64_t>()
                     : config["hidden_size"].get<uint64_t>() /
                           config["num_attention_heads"].get<uint64_t>());
  ASSERT_TRUE(!runs.empty() && runs[0].mixed > 0);
  std::vector<std::vector<uint32_t>> mixed_tokens;
  for (const Fp8KvRun& run : runs) {
    SCOPED_TRACE(run.name);
    ClusterOptions options;
    options.prefill = run.prefill;
    options.decode = run.decode;
    options.mixed = run.mixed;
    options.model_dir = model_dir;
    options.worker_flags = {"--kv_cache_dtype=fp8"};
    options.prefill_flags = run.prefill_flags;
    options.decode_flags = run.decode_flags;
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<std::vector<uint32_t>> tokens;
    for (size_t i : {0, 1, 2, 3, 5}) {
      Result r = Generate((*cluster)->router(), ToRequest(Prompt{prompts[i], 12}));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message() << (*cluster)->Logs();
      tokens.push_back(r.tokens);
    }
    EXPECT_NE((*cluster)->Logs().find(run.log_line), std::string::npos) << run.log_line;
    if (run.mixed > 0) {
      mixed_tokens = tokens;
      continue;
    }
    EXPECT_EQ(tokens, mixed_tokens);
    auto stats = (*cluster)->Stats("decode-0");
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->kv_bytes_received(), 0u) << (*cluster)->Logs();
    const uint64_t block_bytes = config["num_hidden_layers"].get<uint64_t>() * 16 * layer_bytes /
                                 (latent ? 1 : static_cast<uint64_t>(run.kv_split));
    EXPECT_EQ(stats->kv_bytes_received() % block_bytes, 0u) << stats->kv_bytes_received();
    EXPECT_EQ(stats->kv_load_failures(), 0u);
    EXPECT_EQ(stats->kv_recomputes(), 0u);
  }
}

}  // namespace tandem::e2e
