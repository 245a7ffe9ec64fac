// --kv_cache_dtype=fp8 for GQA models on the CUDA backend (GPU; skips without one): the K / V
// pool in e4m3 with one scale per tensor (CudaBackendConfig::fp8_kv, runtime/engine/kv_layout.h),
// written by the RoPE + KV-write kernels and read by the prefill and decode kernels.
//  * a checkpoint's calibrated per-layer K / V scales are the ones each layer uses;
//  * a head_dim 128 GQA model with random weights (prompts long enough to be prefilled in chunks
//    over their own FP8 prefix) follows the 16-bit pool and the CPU backend's fp32 logits
//    (FP8 KV is lossy: cosine >= 0.99, top-1 equal where the reference's top-2 gap is wide),
//    with the prefill kernel and with the decode kernel prefilling, and with Qwen3's q / k norms;
//  * CUDA graphs and eager decode give identical tokens and logits over the FP8 pool, and the
//    batch-1 qkv GEMVs' RoPE epilogues (bf16 and FP8 weights) the separate RoPE kernel's;
//  * with TANDEM_FP8_KV_FIXTURES set (tests/gpu/fp8_kv_cuda_golden.sh builds head_dim 64 / 128
//    fixtures with tests/golden/make_golden_moe.py on the GPU machine), transformers' logits and
//    greedy tokens.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_engine_test_util.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

using engine_cuda_test::ArgMax;
using engine_cuda_test::Cosine;
using engine_cuda_test::ExpectSameOutputs;
using engine_cuda_test::MaxAbs;
using engine_cuda_test::MidBackend;
using engine_cuda_test::Output;
using engine_cuda_test::RandomPrompts;
using engine_cuda_test::RunPrompts;
using engine_cuda_test::ScaledRandomWeights;

// `got` (an FP8 pool) against a reference's last-prompt logits: cosine >= min_cosine, and the
// top-1 the same wherever the reference's top-2 gap is at least 5% of its largest |logit|.
void ExpectNear(const std::vector<Output>& got, const std::vector<Output>& ref, double min_cosine,
                const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << what << ", prompt " << i);
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size());
    EXPECT_GE(Cosine(got[i].logits, ref[i].logits), min_cosine);
    std::vector<float> sorted = ref[i].logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] >= 0.05f * MaxAbs(ref[i].logits)) {
      EXPECT_EQ(ArgMax(got[i].logits), ArgMax(ref[i].logits));
    }
  }
}

void CheckAgainstReferences(const ModelConfig& model, uint32_t seed) {
  // Up to 700 tokens: a prompt over max_num_batched_tokens (512, RunPrompts) is prefilled in two
  // chunks, the second reading the first's K / V back from the FP8 pool.
  const auto prompts = RandomPrompts(6, 700, static_cast<int>(model.vocab_size), seed);
  const ModelWeights weights = ScaledRandomWeights(model, seed);
  CudaBackendConfig fp8 = MidBackend();
  fp8.fp8_kv = true;
  CudaBackendConfig fp8_decode_kernel = fp8;
  fp8_decode_kernel.use_prefill_kernel = false;
  // The prefill steps widen the pool for the wgmma kernel by default; with no budget the
  // mma.sync kernel reads the codes.
  CudaBackendConfig fp8_codes = fp8;
  fp8_codes.prefill_fp8_widen_max_bytes = 0;
  const CudaBackendConfig bf16 = MidBackend();
  const ExecutorFactory fp8_factory = CudaExecutorFactory(fp8);
  ASSERT_EQ(fp8_factory.kv_dtype, KvDtype::kFp8E4m3);
  const ExecutorFactory fp8_decode_factory = CudaExecutorFactory(fp8_decode_kernel);
  const ExecutorFactory fp8_codes_factory = CudaExecutorFactory(fp8_codes);
  const ExecutorFactory bf16_factory = CudaExecutorFactory(bf16);
  const auto got = RunPrompts(model, weights, prompts, 4, &fp8_factory, true);
  const auto via_decode = RunPrompts(model, weights, prompts, 4, &fp8_decode_factory, true);
  const auto via_codes = RunPrompts(model, weights, prompts, 4, &fp8_codes_factory, true);
  const auto pool16 = RunPrompts(model, weights, prompts, 4, &bf16_factory, true);
  const auto cpu = RunPrompts(model, weights, prompts, 4, nullptr, true);
  ExpectNear(got, cpu, 0.99, "FP8 pool vs the CPU backend (fp32)");
  ExpectNear(got, pool16, 0.99, "FP8 pool vs a bf16 pool");
  ExpectNear(via_decode, cpu, 0.99, "FP8 pool prefilled by the decode kernel vs the CPU backend");
  // The same codes read by two kernels: only summation orders and roundings differ.
  ExpectNear(got, via_decode, 0.999, "prefill kernel vs decode kernel over the FP8 pool");
  ExpectNear(got, via_codes, 0.999, "widened wgmma prefill vs mma.sync prefill over the codes");
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].tokens.size(), 4u);
}

TEST(CudaFp8KvTest, GqaModelFollowsTheBf16PoolAndTheCpuBackend) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  CheckAgainstReferences(engine_test::MidConfig(), seed);
}

// Qwen3's per-head q / k RMSNorm: the fused QkNormRopeQkvToCache kernel quantizes into the pool.
TEST(CudaFp8KvTest, QkNormModelFollowsTheBf16PoolAndTheCpuBackend) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig model = engine_test::MidConfig();
  model.architecture = "Qwen3ForCausalLM";
  model.qk_norm = true;
  CheckAgainstReferences(model, seed);
}

TEST(CudaFp8KvTest, GraphsAndEagerGiveIdenticalOutputs) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  CudaBackendConfig graphs = MidBackend();
  graphs.fp8_kv = true;
  graphs.gemm_autotune = false;  // timing-based GEMM choices could differ between engines
  CudaBackendConfig eager = graphs;
  eager.enable_cuda_graphs = false;
  const auto stats = ExpectSameOutputs(
      model, seed, graphs, eager, RandomPrompts(5, 300, static_cast<int>(model.vocab_size), seed),
      12, /*together=*/true);
  EXPECT_GT(stats.first.graph_steps, 0);
  EXPECT_EQ(stats.second.graph_steps, 0);
  // The prompts' prefill steps widened the pool for the wgmma kernel (both engines).
  EXPECT_GT(stats.first.widened_fp8_prefill_steps, 0);
  EXPECT_EQ(stats.first.widened_fp8_prefill_steps, stats.second.widened_fp8_prefill_steps);
}

// A checkpoint's calibrated scales (LayerWeights::kv_k_scale / kv_v_scale, e.g. modelopt's
// k_proj.k_scale) quantize and dequantize each layer's K / V: only layer 1 calibrated (K 3, V 2;
// layer 0 keeps kFp8KvTensorScale) gives other logits than no calibration (so layer 1's own
// scales are read, not layer 0's), both within FP8 KV's error of the CPU backend's fp32.
TEST(CudaFp8KvTest, CalibratedScalesApplyPerLayer) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ModelConfig model = engine_test::MidConfig();
  const auto prompts = RandomPrompts(4, 300, static_cast<int>(model.vocab_size), seed);
  const ModelWeights plain = ScaledRandomWeights(model, seed);
  ModelWeights calibrated = plain;
  calibrated.layers[1].kv_k_scale = 3.0f;
  calibrated.layers[1].kv_v_scale = 2.0f;
  CudaBackendConfig fp8 = MidBackend();
  fp8.fp8_kv = true;
  fp8.gemm_autotune = false;
  const ExecutorFactory factory = CudaExecutorFactory(fp8);
  const auto a = RunPrompts(model, plain, prompts, 4, &factory, true);
  const auto b = RunPrompts(model, calibrated, prompts, 4, &factory, true);
  const auto cpu = RunPrompts(model, plain, prompts, 4, nullptr, true);
  ExpectNear(a, cpu, 0.99, "no calibration vs the CPU backend");
  ExpectNear(b, cpu, 0.99, "layer 1 calibrated vs the CPU backend");
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) differ += a[i].logits != b[i].logits;
  EXPECT_EQ(differ, static_cast<int>(prompts.size())) << "layer 1's scales changed no logits";
}

// Batch-1 steps (prompts one at a time) write the FP8 pool from the qkv GEMVs' RoPE epilogues
// (GemvRopeKv::k_scale / v_scale): the bf16 fold (SmallMLinearNormInRopeKv) and the FP8 weights'
// W8A16 one (Fp8W16GemvNormInRopeKv) give the tokens and logits of the separate RopeQkvToCache,
// bit for bit.
TEST(CudaFp8KvTest, Batch1RopeFoldsWriteTheSeparateKernelsCodes) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig model = engine_test::MidConfig();
  auto prompts = RandomPrompts(4, 60, static_cast<int>(model.vocab_size), seed);
  prompts[0].resize(1);
  CudaBackendConfig on = MidBackend();
  on.fp8_kv = true;
  on.gemm_autotune = false;
  on.fold_rope = true;  // (off by default: CudaBackendConfig::fold_rope)
  CudaBackendConfig off = on;
  off.fold_rope = false;
  const auto stats = ExpectSameOutputs(model, seed, on, off, prompts, 10, /*together=*/false);
  EXPECT_GT(stats.first.folded_rope_steps, 4 * 8);
  EXPECT_EQ(stats.second.folded_rope_steps, 0);

  model.quantization.method = WeightQuantization::Method::kOnlineFp8;
  model.quantization.block_rows = 1;
  const ExecutorFactory factory = CudaExecutorFactory(on);
  std::vector<Output> outs[2];
  for (int i = 0; i < 2; ++i) {  // the W8A16 fold, then the separate kernel
    setenv("TANDEM_FP8_W16_ROPE", i == 0 ? "1" : "0", /*overwrite=*/1);
    ModelWeights w = RandomModelWeights(model, seed);
    ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
    outs[i] = RunPrompts(model, std::move(w), prompts, 10, &factory, false);
  }
  unsetenv("TANDEM_FP8_W16_ROPE");
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(outs[0][p].tokens.size(), 10u) << "prompt " << p;
    EXPECT_EQ(outs[0][p].tokens, outs[1][p].tokens) << "FP8 weights, prompt " << p;
    EXPECT_EQ(outs[0][p].logits, outs[1][p].logits) << "FP8 weights, prompt " << p;
  }
}

// transformers' reference (expected.json of tests/golden/make_golden_moe.py) for fixtures built at
// test time on the GPU machine: logits within FP8 KV's error (cosine >= 0.99) and greedy tokens
// equal until the first step whose reference top-2 gap is under 10% of the largest |logit|.
class CudaFp8KvGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaFp8KvGoldenTest, MatchesTransformers) {
  TANDEM_SKIP_WITHOUT_GPU();
  const char* root = std::getenv("TANDEM_FP8_KV_FIXTURES");
  if (root == nullptr) {
    GTEST_SKIP() << "TANDEM_FP8_KV_FIXTURES unset (tests/gpu/fp8_kv_cuda_golden.sh builds them)";
  }
  const std::string dir = std::string(root) + "/" + GetParam();
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in.good()) << "missing " << dir << "/expected.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto logits = j["last_prompt_logits"].get<std::vector<std::vector<float>>>();
  const auto greedy = j["greedy_tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto gaps = j["greedy_top2_gaps"].get<std::vector<std::vector<float>>>();
  auto model = LoadModelConfig(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto weights = LoadModelWeights(dir, *model);
  ASSERT_TRUE(weights.ok()) << weights.status();
  CudaBackendConfig backend;
  backend.fp8_kv = true;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  for (bool together : {true, false}) {
    SCOPED_TRACE(together ? "batched" : "alone");
    const std::vector<Output> got =
        RunPrompts(*model, *weights, prompts, j["max_new_tokens"].get<int>(), &factory, together);
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << GetParam() << " prompt " << i);
      ASSERT_EQ(got[i].logits.size(), logits[i].size());
      EXPECT_GE(Cosine(got[i].logits, logits[i]), 0.99);
      const float margin = 0.1f * MaxAbs(logits[i]);
      ASSERT_EQ(got[i].tokens.size(), greedy[i].size());
      for (size_t step = 0; step < greedy[i].size(); ++step) {
        if (gaps[i][step] < margin) break;
        EXPECT_EQ(got[i].tokens[step], greedy[i][step]) << "step " << step;
        if (got[i].tokens[step] != greedy[i][step]) break;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFp8KvGoldenTest,
                         ::testing::Values("mistral_f32_hd64", "qwen3_f32_hd128"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace tandem::runtime::cuda
