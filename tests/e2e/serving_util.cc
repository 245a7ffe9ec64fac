#include "tests/e2e/serving_util.h"

#include <random>
#include <utility>

#include "gtest/gtest.h"
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

}  // namespace tandem::e2e
