#include "runtime/cuda/cuda_engine_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tandem::runtime::cuda::engine_cuda_test {

std::vector<Output> RunPrompts(const ModelConfig& model, ModelWeights weights,
                               const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                               const ExecutorFactory* factory, bool together,
                               ExecutorStats* stats) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 64;
  auto engine = Engine::Create(config, model, std::move(weights), {}, factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> out(prompts.size());
  if (!engine.ok()) return out;
  auto drain = [&] {
    while ((*engine)->HasUnfinished()) {
      auto updates = (*engine)->Step();
      ASSERT_TRUE(updates.ok()) << updates.status();
      for (RequestUpdate& u : *updates) {
        Output& o = out[u.request_id];
        o.tokens.insert(o.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
        if (!u.last_prompt_logits.empty()) o.logits = std::move(u.last_prompt_logits);
      }
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = max_new_tokens;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), spec).ok());
    if (!together) drain();
  }
  drain();
  if (stats != nullptr) *stats = (*engine)->executor_stats();
  return out;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
int ArgMax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}
double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return -2;
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

ModelWeights ScaledRandomWeights(const ModelConfig& model, uint32_t seed) {
  ModelWeights weights = RandomModelWeights(model, seed);
  for (std::vector<float>* m : {&weights.embed_tokens, &weights.lm_head}) {
    for (float& x : *m) x *= 25.0f;
  }
  for (LayerWeights& l : weights.layers) {
    for (std::vector<float>* m : {&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj}) {
      for (float& x : *m) x *= 3.0f;
    }
  }
  return weights;
}

CudaBackendConfig MidBackend() {
  CudaBackendConfig backend;
  const char* v = std::getenv("TANDEM_TEST_PREFILL");
  const std::string mode = v != nullptr ? v : "wgmma";
  backend.use_prefill_kernel = mode != "off";
  backend.prefill_allow_wgmma = mode == "wgmma";
  return backend;
}

std::vector<std::vector<int32_t>> RandomPrompts(int n, int max_len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(n);
  for (auto& p : prompts) {
    p.resize(1 + rng() % max_len);
    for (int32_t& t : p) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
  }
  return prompts;
}

std::pair<ExecutorStats, ExecutorStats> ExpectSameOutputs(
    const ModelConfig& model, uint32_t seed, const CudaBackendConfig& on,
    const CudaBackendConfig& off, const std::vector<std::vector<int32_t>>& prompts,
    int max_new_tokens, bool together) {
  const ExecutorFactory on_factory = CudaExecutorFactory(on);
  const ExecutorFactory off_factory = CudaExecutorFactory(off);
  std::pair<ExecutorStats, ExecutorStats> stats;
  const auto got = RunPrompts(model, RandomModelWeights(model, seed), prompts, max_new_tokens,
                              &on_factory, together, &stats.first);
  const auto want = RunPrompts(model, RandomModelWeights(model, seed), prompts, max_new_tokens,
                               &off_factory, together, &stats.second);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens.size(), static_cast<size_t>(max_new_tokens)) << "prompt " << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
    EXPECT_EQ(got[i].logits, want[i].logits) << "prompt " << i;
  }
  return stats;
}

std::pair<ExecutorStats, ExecutorStats> ExpectBatch1OptionKeepsOutputs(
    void (*set)(CudaBackendConfig&, bool), const ModelConfig& model) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto prompts = RandomPrompts(6, 50, static_cast<int>(model.vocab_size), seed);
  prompts[0].resize(1);
  prompts[1].resize(1);
  CudaBackendConfig on = MidBackend();
  on.gemm_autotune = false;
  CudaBackendConfig off = on;
  set(on, true);
  set(off, false);
  return ExpectSameOutputs(model, seed, on, off, prompts, 12, false);
}

}  // namespace tandem::runtime::cuda::engine_cuda_test
