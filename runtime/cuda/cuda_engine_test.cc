// The engine on the CUDA backend (GPU; skips without one):
//  * golden fixtures (tests/golden/fixtures, transformers' outputs): bf16 / f16 checkpoints at
//    the README's reduced-precision tolerances, f32 checkpoints served in bf16 at the bf16
//    tolerances; and against the CPU backend's fp32 logits on the same prompts;
//  * graph-captured and uncaptured decode give identical tokens (and graphs were used);
//  * the decode kernel's in-kernel split merge gives the merge kernel's tokens and logits;
//  * a head_dim 128 GQA model with host random weights agrees with the CPU backend;
//  * device-generated dummy weights run end to end; bad configs fail cleanly;
//  * async scheduling gives the synchronous engine's tokens;
//  * FP8 batch-1 steps on the weight-only GEMVs with the norms folded in agree with the unfolded
//    FP8 path;
//  * a Qwen3-MoE's folded batch-1 steps (fold_moe) and its q/k norms inside the RoPE kernel
//    (qk_norm_rope) give the unfolded / separate kernels' tokens and logits bit for bit;
//  * DeepSeek MLA models with kv_a_layernorm (and k_pe's RoPE) inside the latent write
//    (mla_norm_in_write, mla_rope_in_write) and
//    their folded batch-1 steps (mla_fold_norm) give the separate kernels' tokens and logits bit
//    for bit.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

std::string FixtureDir(const std::string& variant) {
  const char* root = std::getenv("TANDEM_FIXTURES");
  return std::string(root != nullptr ? root : "tests/golden/fixtures") + "/" + variant;
}

struct Golden {
  std::string dtype;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> greedy;
  std::vector<std::vector<float>> gaps;
  int max_new_tokens = 0;
};

Golden LoadGolden(const std::string& variant) {
  std::ifstream in(FixtureDir(variant) + "/expected.json");
  Golden g;
  if (!in.good()) {
    ADD_FAILURE() << "missing fixture " << FixtureDir(variant)
                  << " (run from the repo root or set TANDEM_FIXTURES)";
    return g;
  }
  nlohmann::json j = nlohmann::json::parse(in);
  g.dtype = j["dtype"];
  g.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  g.logits = j["last_prompt_logits"].get<std::vector<std::vector<float>>>();
  g.greedy = j["greedy_tokens"].get<std::vector<std::vector<int32_t>>>();
  g.gaps = j["greedy_top2_gaps"].get<std::vector<std::vector<float>>>();
  g.max_new_tokens = j["max_new_tokens"];
  return g;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// Runs every prompt through one engine (all at once when `together`).
std::vector<Output> RunPrompts(const ModelConfig& model, ModelWeights weights,
                               const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                               const ExecutorFactory* factory, bool together,
                               ExecutorStats* stats = nullptr) {
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

struct GoldenCase {
  const char* variant;
  ActDtype dtype;
  double margin;  // top-1 must agree where transformers' top-2 gap >= margin * max|logit|
};

class CudaGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(CudaGoldenTest, MatchesTransformersAndCpuBackend) {
  TANDEM_SKIP_WITHOUT_GPU();
  const GoldenCase& c = GetParam();
  const Golden g = LoadGolden(c.variant);
  ASSERT_FALSE(g.prompts.empty());
  auto model = LoadModelConfig(FixtureDir(c.variant));
  ASSERT_TRUE(model.ok()) << model.status();
  auto weights = LoadModelWeights(FixtureDir(c.variant), *model);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ModelWeights cpu_weights = *weights;

  CudaBackendConfig backend;
  backend.dtype = c.dtype;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  // Together (continuous batching, graphs for decode) and one at a time.
  for (bool together : {true, false}) {
    SCOPED_TRACE(together ? "batched" : "alone");
    const std::vector<Output> got =
        RunPrompts(*model, *weights, g.prompts, g.max_new_tokens, &factory, together);
    const std::vector<Output> cpu =
        RunPrompts(*model, cpu_weights, g.prompts, g.max_new_tokens, nullptr, together);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << c.variant << " prompt " << i);
      ASSERT_EQ(got[i].logits.size(), g.logits[i].size());
      EXPECT_GE(Cosine(got[i].logits, g.logits[i]), 0.999);
      EXPECT_GE(Cosine(got[i].logits, cpu[i].logits), 0.999);
      const float scale = MaxAbs(g.logits[i]);
      const float margin = static_cast<float>(c.margin) * scale;
      const int ours = ArgMax(got[i].logits);
      // transformers' value of our top-1 is within its rounding margin of its own top-1.
      EXPECT_GE(g.logits[i][ours], g.logits[i][ArgMax(g.logits[i])] - margin);
      // Greedy tokens until the first step whose reference gap is under the margin.
      ASSERT_EQ(got[i].tokens.size(), g.greedy[i].size());
      for (size_t step = 0; step < g.greedy[i].size(); ++step) {
        if (g.gaps[i][step] < margin) break;
        EXPECT_EQ(got[i].tokens[step], g.greedy[i][step]) << "step " << step;
        if (got[i].tokens[step] != g.greedy[i][step]) break;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaGoldenTest,
    ::testing::Values(GoldenCase{"llama_bf16", ActDtype::kBf16, 0.03},
                      GoldenCase{"qwen2_f16", ActDtype::kFp16, 0.005},
                      GoldenCase{"llama_f32_gqa", ActDtype::kBf16, 0.03},
                      GoldenCase{"llama_f32_mqa_headdim_bias", ActDtype::kBf16, 0.03},
                      GoldenCase{"llama_f32_llama3_tied", ActDtype::kBf16, 0.03},
                      GoldenCase{"qwen2_f32", ActDtype::kFp16, 0.005}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) {
      return std::string(info.param.variant);
    });

// TANDEM_TEST_PREFILL=off|mma|wgmma (default wgmma, the backend's default) picks the prefill
// kernel of the MidConfig tests, to compare variants on a GPU without rebuilding.
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

TEST(CudaEngineTest, GraphAndEagerDecodeGiveIdenticalTokens) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(13, 70, static_cast<int>(model.vocab_size), seed);
  CudaBackendConfig with_graphs = MidBackend();
  with_graphs.gemm_autotune = false;  // timing-based GEMM choices could differ between engines
  CudaBackendConfig without = with_graphs;
  without.enable_cuda_graphs = false;
  const ExecutorFactory graphs = CudaExecutorFactory(with_graphs);
  const ExecutorFactory eager = CudaExecutorFactory(without);
  ExecutorStats graph_stats, eager_stats;
  const auto a =
      RunPrompts(model, RandomModelWeights(model, seed), prompts, 24, &graphs, true, &graph_stats);
  const auto b =
      RunPrompts(model, RandomModelWeights(model, seed), prompts, 24, &eager, true, &eager_stats);
  EXPECT_GT(graph_stats.graph_steps, 0);
  EXPECT_GT(graph_stats.graphs_captured, 0);
  EXPECT_EQ(eager_stats.graph_steps, 0);
  EXPECT_GT(eager_stats.padded_steps, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "prompt " << i;
    EXPECT_EQ(a[i].tokens.size(), 24u);
  }
}

// Runs `prompts` through an engine on `on` and one on `off` (the random weights of `seed` each)
// and expects every prompt's max_new_tokens tokens and last-prompt logits equal, bit for bit.
// Returns the two engines' stats.
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

// CudaBackendConfig::decode_merge_in_kernel: the decode kernel merging its own KV splits (in its
// zeroed workspace, graph replays included) gives the tokens and logits of the PDL merge kernel,
// bit for bit. The decode kernel serves every step (prompts of up to 600 tokens in chunks too)
// and the padded decode graphs plan for max_model_len keys, so steps split.
TEST(CudaEngineTest, DecodeKernelMergesItsSplitsAsTheMergeKernelDoes) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(7, 600, static_cast<int>(model.vocab_size), seed);
  CudaBackendConfig in_kernel = MidBackend();
  in_kernel.gemm_autotune = false;
  in_kernel.use_prefill_kernel = false;
  in_kernel.decode_merge_in_kernel = true;
  CudaBackendConfig separate = in_kernel;
  separate.decode_merge_in_kernel = false;
  const auto [in_kernel_stats, separate_stats] =
      ExpectSameOutputs(model, seed, in_kernel, separate, prompts, 16, true);
  EXPECT_GT(in_kernel_stats.split_merge_in_kernel_steps, 0);
  EXPECT_GT(in_kernel_stats.graph_steps, 0);
  EXPECT_EQ(separate_stats.split_merge_in_kernel_steps, 0);
}

// Six random prompts (two of 1 token, so their prefill is a batch-1 step too) one at a time, so
// every decode step is batch 1 (graphs), with a MidBackend whose option `set` turns on and off;
// tokens and last-prompt logits compared by ExpectSameOutputs. Returns (on, off) stats.
std::pair<ExecutorStats, ExecutorStats> ExpectBatch1OptionKeepsOutputs(
    void (*set)(CudaBackendConfig&, bool), const ModelConfig& model = engine_test::MidConfig()) {
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

// CudaBackendConfig::fold_norm: batch-1 steps with the residual adds + RMSNorms inside the GEMVs
// give the separate kernels' tokens and logits bit for bit, the folded prefills included.
TEST(CudaEngineTest, FoldedNormGivesTheSeparateKernelsTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto [folded_stats, separate_stats] =
      ExpectBatch1OptionKeepsOutputs([](CudaBackendConfig& c, bool on) { c.fold_norm = on; });
  EXPECT_GT(folded_stats.folded_norm_steps, 6 * 10);  // every decode step, 2 prefills
  EXPECT_GT(folded_stats.graph_steps, 0);
  EXPECT_EQ(separate_stats.folded_norm_steps, 0);
}

// CudaBackendConfig::fold_rope: the folded batch-1 steps with RoPE + the KV write in the qkv
// GEMV's epilogue give the separate RopeQkvToCache kernel's tokens and logits bit for bit (the
// same products, the same rotation arithmetic), the 1-token prompts' folded prefill included.
TEST(CudaEngineTest, FoldedRopeGivesTheSeparateKernelsTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto [fused_stats, separate_stats] =
      ExpectBatch1OptionKeepsOutputs([](CudaBackendConfig& c, bool on) { c.fold_rope = on; });
  EXPECT_GT(fused_stats.folded_rope_steps, 6 * 10);  // every decode step, 2 prefills
  EXPECT_EQ(fused_stats.folded_rope_steps, fused_stats.folded_norm_steps);
  EXPECT_GT(fused_stats.graph_steps, 0);
  EXPECT_EQ(separate_stats.folded_rope_steps, 0);
}

// A Qwen3-MoE of MidConfig's attention (per-head q/k norms): 3 layers, the middle one dense
// (mlp_only_layers), 8 experts of width 256, top-2 renormalised.
ModelConfig MidQwen3MoeConfig() {
  ModelConfig c = engine_test::MidConfig();
  c.architecture = "Qwen3MoeForCausalLM";
  c.num_hidden_layers = 3;
  c.qk_norm = true;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 256;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  c.rope_theta = 1e6;
  return c;
}

// CudaBackendConfig::fold_moe: a bf16 Qwen3-MoE's folded batch-1 steps (o_proj and the MoE
// combine adding into the residual stream, one RMSNorm before the experts; its dense layer as
// fold_norm folds it) give the unfolded layers' tokens and logits bit for bit, the 1-token
// prompts' folded prefill included.
TEST(CudaEngineTest, FoldedMoeGivesTheUnfoldedLayersTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto [folded_stats, separate_stats] = ExpectBatch1OptionKeepsOutputs(
      [](CudaBackendConfig& c, bool on) { c.fold_moe = on; }, MidQwen3MoeConfig());
  EXPECT_GT(folded_stats.folded_norm_steps, 6 * 10);  // every decode step, 2 prefills
  EXPECT_GT(folded_stats.graph_steps, 0);
  EXPECT_EQ(separate_stats.folded_norm_steps, 0);
}

// CudaBackendConfig::qk_norm_rope: Qwen3's q/k head norms inside the RoPE + KV-write kernel give
// QkHeadRmsNorm + RopeQkvToCache's tokens and logits bit for bit, on the folded batch-1 steps
// (a MoE model: fold_moe) and on the unfolded prefills of up to 50 tokens.
TEST(CudaEngineTest, QkNormInRopeGivesTheSeparateKernelsTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto [fused_stats, separate_stats] = ExpectBatch1OptionKeepsOutputs(
      [](CudaBackendConfig& c, bool on) { c.qk_norm_rope = on; }, MidQwen3MoeConfig());
  EXPECT_GT(fused_stats.folded_norm_steps, 6 * 10);
  EXPECT_GT(fused_stats.graph_steps, 0);
}

// A DeepSeek-V3 of DeepSeek's latent widths (kv_lora_rank 512, k_pe 64: the tensor-core MLA
// kernels), q_lora, 3 layers (the first dense, then MoE: 8 routed experts top-2 in 4 groups, one
// shared expert). q_lora = false: q_proj, as V2-Lite.
ModelConfig MidMlaConfig(bool q_lora = true) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      std::string(R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 1024,
      "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 4, "first_k_dense_replace": 1,
      "q_lora_rank": )") +
      (q_lora ? "128" : "null") + R"(,
      "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
      "moe_intermediate_size": 256, "n_shared_experts": 1, "norm_topk_prob": true,
      "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "rope_interleave": true,
      "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2})");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

// CudaBackendConfig::mla_norm_in_write: DeepSeek's kv_a_layernorm (and with mla_rope_in_write
// k_pe's RoPE) inside the latent-write kernel (MlaWriteLatentNormed) gives RmsNorm (+ MlaRope) +
// MlaWriteLatent's tokens and logits bit for bit, on the batch-1 decode steps (graphs) and the
// prefills of up to 50 tokens: MidMlaConfig, and the tiny-mla preset (kv_lora_rank 32: the plain
// MLA kernel). Then mla_rope_in_write alone (the norm in the write kernel both ways).
TEST(CudaEngineTest, MlaNormInLatentWriteGivesTheSeparateKernelsTokensAndLogits) {
  const ModelConfig mid = MidMlaConfig();  // parsed here, GPU or not
  absl::StatusOr<ModelConfig> tiny = PresetConfig("tiny-mla");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  TANDEM_SKIP_WITHOUT_GPU();
  using Set = void (*)(CudaBackendConfig&, bool);
  const Set norm = [](CudaBackendConfig& c, bool on) { c.mla_norm_in_write = on; };
  const Set rope = [](CudaBackendConfig& c, bool on) { c.mla_rope_in_write = on; };
  for (const Set set : {norm, rope}) {
    for (const ModelConfig& model : {mid, *tiny}) {
      SCOPED_TRACE(::testing::Message() << (set == norm ? "norm" : "rope") << " in write, "
                                        << "kv_lora_rank " << model.kv_lora_rank);
      const auto [fused_stats, separate_stats] = ExpectBatch1OptionKeepsOutputs(set, model);
      EXPECT_GT(fused_stats.graph_steps, 0);
      EXPECT_GT(separate_stats.graph_steps, 0);
    }
  }
}

// CudaBackendConfig::mla_fold_norm: DeepSeek's folded batch-1 steps (the input norm inside
// q_a_proj's / q_proj's and kv_a_proj_with_mqa's GEMVs, o_proj / down_proj / the MoE combine adding
// into the residual stream) give the unfolded layers' tokens and logits bit for bit, the 1-token
// prompts' folded prefill included: MidMlaConfig (q_lora, MoE), the same without q_lora (q_proj,
// V2-Lite's form) and the tiny-mla preset (dense).
TEST(CudaEngineTest, MlaFoldedNormGivesTheUnfoldedLayersTokensAndLogits) {
  const ModelConfig no_q_lora = MidMlaConfig(/*q_lora=*/false);
  EXPECT_EQ(no_q_lora.q_lora_rank, 0);
  absl::StatusOr<ModelConfig> tiny = PresetConfig("tiny-mla");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  TANDEM_SKIP_WITHOUT_GPU();
  for (const ModelConfig& model : {MidMlaConfig(), no_q_lora, *tiny}) {
    SCOPED_TRACE(::testing::Message()
                 << "q_lora_rank " << model.q_lora_rank << " kv_lora_rank " << model.kv_lora_rank);
    const auto [folded_stats, separate_stats] = ExpectBatch1OptionKeepsOutputs(
        [](CudaBackendConfig& c, bool on) { c.mla_fold_norm = on; }, model);
    EXPECT_GT(folded_stats.folded_norm_steps, 6 * 10);  // every decode step, 2 prefills
    EXPECT_GT(folded_stats.graph_steps, 0);
    EXPECT_EQ(separate_stats.folded_norm_steps, 0);
  }
}

// CudaBackendConfig::fp8_weight_only_fold: an FP8 model (random weights quantized per channel at
// load) runs its batch-1 steps on the weight-only FP8 GEMVs with the norms folded in. Weight-only
// FP8 (scheme kNone): the unfolded engine multiplies the same bf16 activations by the same codes
// (other kernels, another summation order): the folded 1-token prefills' logits agree to fp32
// rounding. Per-token activations: the unfolded engine quantizes them, the fold does not: the
// logits differ by that quantization's noise. Longer prompts' prefills are not batch 1: the same
// bits either way.
TEST(CudaEngineTest, Fp8WeightOnlyFoldAgreesWithTheUnfoldedFp8Path) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  using Scheme = kernels::Fp8ActivationScheme;
  for (const Scheme act : {Scheme::kNone, Scheme::kDynamicToken}) {
    SCOPED_TRACE(act == Scheme::kNone ? "weight-only" : "per-token activations");
    ModelConfig model = engine_test::MidConfig();
    model.quantization.method = WeightQuantization::Method::kOnlineFp8;
    model.quantization.block_rows = 1;
    model.quantization.activation = act;
    auto prompts = RandomPrompts(4, 60, static_cast<int>(model.vocab_size), seed);
    prompts[0].resize(1);
    prompts[1].resize(1);
    CudaBackendConfig on = MidBackend();
    on.gemm_autotune = false;
    CudaBackendConfig off = on;
    off.fp8_weight_only_fold = false;
    std::vector<Output> outs[2];
    ExecutorStats stats[2];
    for (int i = 0; i < 2; ++i) {
      ModelWeights w = RandomModelWeights(model, seed);
      ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
      const ExecutorFactory factory = CudaExecutorFactory(i == 0 ? on : off);
      outs[i] = RunPrompts(model, std::move(w), prompts, 8, &factory, false, &stats[i]);
    }
    EXPECT_GT(stats[0].folded_norm_steps, 4 * 6);  // every decode step, 2 prefills
    EXPECT_EQ(stats[1].folded_norm_steps, 0);
    for (size_t p = 0; p < prompts.size(); ++p) {
      ASSERT_EQ(outs[0][p].tokens.size(), 8u) << "prompt " << p;
      if (p >= 2) {
        EXPECT_EQ(outs[0][p].logits, outs[1][p].logits) << "prompt " << p;
        continue;
      }
      const float max_abs = MaxAbs(outs[1][p].logits);
      EXPECT_GE(Cosine(outs[0][p].logits, outs[1][p].logits), act == Scheme::kNone ? 0.9999 : 0.99)
          << "prompt " << p;
      for (size_t v = 0; v < outs[1][p].logits.size(); ++v) {
        ASSERT_NEAR(outs[0][p].logits[v], outs[1][p].logits[v],
                    (act == Scheme::kNone ? 1e-2 : 0.1) * max_abs)
            << "prompt " << p << " logit " << v;
      }
    }
  }
}

// TANDEM_FP8_W16_ROPE (cuda_llama_model_fp8.cc): an FP8 model's weight-only batch-1 steps with
// RoPE + the KV write in the qkv GEMV's epilogue (Fp8W16GemvNormInRopeKv) give the tokens and
// logits of the same steps with the separate RopeQkvToCache kernel (=0) bit for bit: the fold's
// q / k / v are Fp8W16GemvNormIn's products rotated with the same arithmetic. Per-channel and
// 128 x 128 block weights (per-row / grouped scales), the 1-token prompts' prefills included.
TEST(CudaEngineTest, Fp8FoldedRopeGivesTheSeparateKernelsTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const int64_t block : {int64_t{1}, int64_t{128}}) {
    SCOPED_TRACE(block == 1 ? "per-channel" : "128 x 128 blocks");
    ModelConfig model = engine_test::MidConfig();
    model.quantization.method = WeightQuantization::Method::kOnlineFp8;
    model.quantization.block_rows = block;
    model.quantization.block_cols = block == 1 ? 0 : block;
    auto prompts = RandomPrompts(4, 50, static_cast<int>(model.vocab_size), seed);
    prompts[0].resize(1);
    prompts[1].resize(1);
    CudaBackendConfig backend = MidBackend();
    backend.gemm_autotune = false;
    const ExecutorFactory factory = CudaExecutorFactory(backend);
    std::vector<Output> outs[2];
    ExecutorStats stats[2];
    for (int i = 0; i < 2; ++i) {  // the fold, then the separate kernel
      setenv("TANDEM_FP8_W16_ROPE", i == 0 ? "1" : "0", /*overwrite=*/1);
      ModelWeights w = RandomModelWeights(model, seed);
      ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
      outs[i] = RunPrompts(model, std::move(w), prompts, 10, &factory, false, &stats[i]);
    }
    unsetenv("TANDEM_FP8_W16_ROPE");
    EXPECT_GT(stats[0].folded_norm_steps, 4 * 8);  // every decode step, 2 prefills
    EXPECT_GT(stats[0].graph_steps, 0);
    for (size_t p = 0; p < prompts.size(); ++p) {
      ASSERT_EQ(outs[0][p].tokens.size(), 10u) << "prompt " << p;
      EXPECT_EQ(outs[0][p].tokens, outs[1][p].tokens) << "prompt " << p;
      EXPECT_EQ(outs[0][p].logits, outs[1][p].logits) << "prompt " << p;
    }
  }
}

// The tensor-parallel path (vocab-shard embedding, all-reduces, logits all-gather) with a group
// of one: over NCCL inside captured decode graphs, and host-staged over Gloo (eager), both
// bit-identical to the runner without a group (every collective of one rank is a copy).
TEST(CudaEngineTest, GroupOfOneRunsTheTensorParallelPathOverNcclInGraphs) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(9, 60, static_cast<int>(model.vocab_size), seed);
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  comm::GlooGroupOptions group_options;
  group_options.store_port = (*server)->port();
  group_options.serve_store = false;
  auto group = comm::GlooProcessGroup::Create(group_options);
  ASSERT_TRUE(group.ok()) << group.status();
  CudaBackendConfig plain = MidBackend();
  plain.gemm_autotune = false;
  const ExecutorFactory plain_factory = CudaExecutorFactory(plain);
  ExecutorStats plain_stats;
  const auto want = RunPrompts(model, RandomModelWeights(model, seed), prompts, 16, &plain_factory,
                               true, &plain_stats);
  for (const char* tp_comm : {"nccl", "gloo"}) {
    SCOPED_TRACE(tp_comm);
    CudaBackendConfig tp = plain;
    tp.group = group->get();
    tp.tp_comm = tp_comm;
    const ExecutorFactory factory = CudaExecutorFactory(tp);
    ExecutorStats stats;
    const auto got =
        RunPrompts(model, RandomModelWeights(model, seed), prompts, 16, &factory, true, &stats);
    if (std::string(tp_comm) == "nccl") {
      EXPECT_GT(stats.graph_steps, 0) << "NCCL collectives are captured in the decode graphs";
    } else {
      EXPECT_EQ(stats.graph_steps, 0) << "host-staged collectives cannot be captured";
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
      EXPECT_EQ(got[i].logits, want[i].logits) << "prompt " << i;
    }
  }
}

TEST(CudaEngineTest, HeadDim128AgreesWithCpuBackend) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(6, 200, static_cast<int>(model.vocab_size), seed);
  // Larger weights than the dummy default so logits are far from uniform.
  ModelWeights weights = RandomModelWeights(model, seed);
  for (std::vector<float>* m : {&weights.embed_tokens, &weights.lm_head}) {
    for (float& x : *m) x *= 25.0f;
  }
  for (LayerWeights& l : weights.layers) {
    for (std::vector<float>* m : {&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj}) {
      for (float& x : *m) x *= 3.0f;
    }
  }
  CudaBackendConfig backend = MidBackend();
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  CudaBackendConfig decode_only = backend;
  decode_only.use_prefill_kernel = false;
  const ExecutorFactory decode_factory = CudaExecutorFactory(decode_only);
  const auto got = RunPrompts(model, weights, prompts, 4, &factory, true);
  const auto via_decode = RunPrompts(model, weights, prompts, 4, &decode_factory, true);
  const auto cpu = RunPrompts(model, weights, prompts, 4, nullptr, true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_GE(Cosine(got[i].logits, cpu[i].logits), 0.999) << "prompt " << i;
    // The prefill kernel and the decode kernel on the same step: same math, fp32 accumulation,
    // but different summation orders, so bf16 roundings of the attention output differ and
    // grow through the layers (transformers' own bf16 vs fp64 is at cosine 0.9998 on the
    // fixtures; a run here measured < 0.9999 once).
    EXPECT_GE(Cosine(got[i].logits, via_decode[i].logits), 0.999) << "prompt " << i;
  }
}

TEST(CudaEngineTest, DeviceDummyWeightsRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  const ModelConfig model = engine_test::MidConfig();
  CudaBackendConfig backend = MidBackend();
  backend.dummy_seed = 7;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  const auto prompts = RandomPrompts(4, 40, static_cast<int>(model.vocab_size), 11);
  const auto a = RunPrompts(model, ModelWeights{}, prompts, 8, &factory, true);
  const auto b = RunPrompts(model, ModelWeights{}, prompts, 8, &factory, true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(a[i].tokens.size(), 8u);
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "same seed, same tokens";
    for (int32_t t : a[i].tokens) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, model.vocab_size);
    }
  }
}

// The device draws the host's dummy values (runtime/model/dummy_draw.h): a model generated on
// the device computes what RandomModelWeights(seed) uploaded from the host computes (the same
// fp32 values rounded to bf16; host and device double-precision math may differ in a rare last
// bit, hence a cosine bound rather than equality).
TEST(CudaEngineTest, DeviceDummyWeightsAreTheHostDraw) {
  TANDEM_SKIP_WITHOUT_GPU();
  const ModelConfig model = engine_test::MidConfig();
  CudaBackendConfig on_device = MidBackend();
  on_device.dummy_seed = 5;
  const ExecutorFactory device_factory = CudaExecutorFactory(on_device);
  const ExecutorFactory host_factory = CudaExecutorFactory(MidBackend());
  const auto prompts = RandomPrompts(4, 40, static_cast<int>(model.vocab_size), 13);
  const auto a = RunPrompts(model, ModelWeights{}, prompts, 4, &device_factory, true);
  const auto b = RunPrompts(model, RandomModelWeights(model, 5), prompts, 4, &host_factory, true);
  const auto other =
      RunPrompts(model, RandomModelWeights(model, 6), prompts, 4, &host_factory, true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_GE(Cosine(a[i].logits, b[i].logits), 0.99999) << "prompt " << i;
    EXPECT_LT(Cosine(a[i].logits, other[i].logits), 0.99) << "prompt " << i << ": seed ignored";
  }
}

// Async scheduling (EngineConfig::async_scheduling): the next step's input ids come from the
// previous step's sampled tokens on the device. Steps of the same batches as synchronous ones
// give the same tokens, greedy and seeded, on one GPU and over NCCL in graphs (a group of one:
// the event wait with a communicator); a stop seen one step late emits nothing more and frees
// every block; a later request reusing them decodes as it does alone.
struct AsyncResult {
  std::vector<std::vector<int32_t>> tokens;
  int64_t graph_steps = 0;
};

AsyncResult RunAsyncOrNot(const ModelConfig& model, const std::vector<RequestSpec>& specs,
                          const ExecutorFactory& factory, bool async, int64_t stagger = -1) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_batched_tokens = 512;
  config.max_num_seqs = 64;
  config.async_scheduling = async;
  AsyncResult result;
  result.tokens.resize(specs.size());
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 21), {}, &factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return result;
  Engine& e = **engine;
  EXPECT_EQ(e.async_scheduling(), async);
  size_t added = 0;
  for (int step = 0; step < 2000 && (added < specs.size() || e.HasUnfinished()); ++step) {
    // All at once, or (stagger >= 0) one after the previous one finished.
    while (added < specs.size() && (stagger < 0 || !e.HasUnfinished())) {
      EXPECT_TRUE(e.AddRequest(static_cast<int64_t>(added), specs[added]).ok());
      ++added;
      if (stagger >= 0) break;
    }
    auto updates = e.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (const RequestUpdate& u : *updates) {
      auto& t = result.tokens[u.request_id];
      t.insert(t.end(), u.new_token_ids.begin(), u.new_token_ids.end());
    }
  }
  EXPECT_FALSE(e.HasUnfinished());
  EXPECT_EQ(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
  result.graph_steps = e.executor_stats().graph_steps;
  return result;
}

TEST(CudaEngineTest, AsyncSchedulingGivesTheSameTokens) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(11, 70, static_cast<int>(model.vocab_size), seed);
  std::vector<RequestSpec> specs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    specs[i].prompt = prompts[i];
    specs[i].max_tokens = 20;
    specs[i].ignore_eos = true;
    if (i % 2 == 1) {
      specs[i].sampling.temperature = 0.8f;
      specs[i].sampling.top_k = 50;
      specs[i].sampling.seed = 7 + i;
    }
  }
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  comm::GlooGroupOptions group_options;
  group_options.store_port = (*server)->port();
  group_options.serve_store = false;
  auto group = comm::GlooProcessGroup::Create(group_options);
  ASSERT_TRUE(group.ok()) << group.status();
  CudaBackendConfig plain = MidBackend();
  plain.gemm_autotune = false;
  CudaBackendConfig nccl = plain;
  nccl.group = group->get();
  for (const CudaBackendConfig& backend : {plain, nccl}) {
    SCOPED_TRACE(backend.group == nullptr ? "one GPU" : "group of one over NCCL");
    const ExecutorFactory factory = CudaExecutorFactory(backend);
    const AsyncResult sync = RunAsyncOrNot(model, specs, factory, false);
    const AsyncResult async = RunAsyncOrNot(model, specs, factory, true);
    EXPECT_GT(async.graph_steps, 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(async.tokens[i], sync.tokens[i]) << "request " << i;
      EXPECT_EQ(async.tokens[i].size(), 20u);
    }
    // One request at a time: request 0 stops at a token it generates (seen one step late),
    // request 1 then reuses its blocks.
    std::vector<RequestSpec> pair = {specs[0], specs[1]};
    const AsyncResult free_run = RunAsyncOrNot(model, pair, factory, false, 0);
    const int32_t stop = free_run.tokens[0][5];
    pair[0].stop_token_ids = {stop};
    const auto first = std::find(free_run.tokens[0].begin(), free_run.tokens[0].end(), stop);
    const std::vector<int32_t> expected(free_run.tokens[0].begin(), first + 1);
    for (bool async_on : {false, true}) {
      const AsyncResult r = RunAsyncOrNot(model, pair, factory, async_on, 0);
      EXPECT_EQ(r.tokens[0], expected) << "async " << async_on;
      EXPECT_EQ(r.tokens[1], free_run.tokens[1]) << "async " << async_on;
    }
  }
}

TEST(CudaEngineTest, RejectsExternalPoolAndBadDtypeShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  ModelConfig model = engine_test::MidConfig();
  model.hidden_size = 500;  // not a multiple of 8
  CudaBackendConfig backend;
  backend.dummy_seed = 1;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  EngineConfig config;
  config.kv_cache_bytes = int64_t{16} << 20;
  auto engine = Engine::Create(config, model, ModelWeights{}, {}, &factory);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
}

}  // namespace
}  // namespace tandem::runtime::cuda
