// The batch-1 folds and fused kernels of the CUDA engine (GPU; skips without one), each against
// its unfolded / separate-kernel path with the option off, tokens and last-prompt logits bit for
// bit unless a case says otherwise:
//  * fold_norm (residual adds + RMSNorms inside the GEMVs), fold_rope (RoPE + KV write in the qkv
//    GEMV);
//  * a Qwen3-MoE's folded batch-1 steps (fold_moe) and its q/k norms inside the RoPE kernel
//    (qk_norm_rope);
//  * DeepSeek MLA models with kv_a_layernorm (and k_pe's RoPE) inside the latent write
//    (mla_norm_in_write, mla_rope_in_write) and their folded batch-1 steps (mla_fold_norm);
//  * FP8 batch-1 steps on the weight-only GEMVs with the norms folded in agree with the unfolded
//    FP8 path; the FP8 RoPE fold; FP8 projections of 9-60 rows on the swapped CUTLASS GEMM agree
//    with the GEMV and cuBLASLt.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_engine_test_util.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

using engine_cuda_test::ArgMax;
using engine_cuda_test::Cosine;
using engine_cuda_test::ExpectBatch1OptionKeepsOutputs;
using engine_cuda_test::ExpectSameOutputs;
using engine_cuda_test::MaxAbs;
using engine_cuda_test::MidBackend;
using engine_cuda_test::Output;
using engine_cuda_test::RandomPrompts;
using engine_cuda_test::RunPrompts;

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
// logits differ by that quantization's noise. Prompts of more than 8 tokens prefill unfolded
// (the fold takes steps of up to 8): the same bits either way.
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
    for (size_t p = 2; p < prompts.size(); ++p) {
      while (prompts[p].size() < 9) prompts[p].push_back(prompts[p][0]);
    }
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

// Steps of 2-8 tokens of an FP8 model fold too where asked (TANDEM_FP8_W16_TOKENS=8: the
// weight-only GEMVs' multi-token form, kernels/fp8/fp8_w8a16_gemv_cuda.h): a weight-only FP8 model
// (per-channel weights, scheme kNone) serving 4 prompts together gives the tokens of the same
// engine with the fold held to batch 1 (TANDEM_FP8_W16_TOKENS=1: the batched steps on
// CudaFp8Linear, which multiplies the same bf16 activations by the same codes in another order),
// its batched decode steps folded. Scaled random weights keep the logits' top two apart.
TEST(CudaEngineTest, Fp8MultiTokenFoldGivesTheUnfoldedTokens) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig model = engine_test::MidConfig();
  model.quantization.method = WeightQuantization::Method::kOnlineFp8;
  model.quantization.block_rows = 1;
  model.quantization.activation = kernels::Fp8ActivationScheme::kNone;
  const auto prompts = RandomPrompts(4, 40, static_cast<int>(model.vocab_size), seed);
  CudaBackendConfig backend = MidBackend();
  backend.gemm_autotune = false;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  std::vector<Output> outs[2];
  ExecutorStats stats[2];
  for (int i = 0; i < 2; ++i) {  // 2-8 tokens folded, then batch 1 only
    setenv("TANDEM_FP8_W16_TOKENS", i == 0 ? "8" : "1", /*overwrite=*/1);
    ModelWeights w = engine_cuda_test::ScaledRandomWeights(model, seed);
    ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
    outs[i] = RunPrompts(model, std::move(w), prompts, 12, &factory, /*together=*/true, &stats[i]);
  }
  unsetenv("TANDEM_FP8_W16_TOKENS");
  EXPECT_GE(stats[0].folded_norm_steps, stats[1].folded_norm_steps + 8);  // the batched decodes
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(outs[0][p].tokens.size(), 12u) << "prompt " << p;
    EXPECT_EQ(outs[0][p].tokens, outs[1][p].tokens) << "prompt " << p;
  }
}

// TANDEM_FP8_GROUP_CODES (cuda_fp8_linear.h): 128 x 128-block FP8 models with 1 x 128 activation
// groups whose producers hand the projections their codes -- CudaLlamaModel's RMSNorms writing the
// qkv / gate_up codes (kernels/fp8/fp8_fused_quant_cuda.h, group128), CudaMlaModel's q_proj and
// kv_a_proj_with_mqa sharing one quantization of the hidden rows (SharesFp8Codes) -- give the
// tokens and logits of the same models with a separate QuantizeActivations pass each (=0) bit for
// bit: the same codes and scales, on the batched decode steps' GEMVs and the prefills' GEMMs
// (batch 1 runs the W8A16 GEMVs either way). MidConfig (dense), MidMlaConfig without q_lora
// (V2-Lite's form: three products share) and with it (kv_a's two parts share).
TEST(CudaEngineTest, Fp8GroupCodesGiveTheSeparateQuantizationTokensAndLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "llama" : variant == 1 ? "mla, no q_lora" : "mla, q_lora");
    ModelConfig model = variant == 0 ? engine_test::MidConfig() : MidMlaConfig(variant == 2);
    model.quantization.method = WeightQuantization::Method::kOnlineFp8;
    model.quantization.block_rows = 128;
    model.quantization.block_cols = 128;
    model.quantization.activation = kernels::Fp8ActivationScheme::kDynamicGroup128;
    const auto prompts = RandomPrompts(5, 60, static_cast<int>(model.vocab_size), seed);
    CudaBackendConfig backend = MidBackend();
    backend.gemm_autotune = false;
    const ExecutorFactory factory = CudaExecutorFactory(backend);
    std::vector<Output> outs[2];
    // Batched decode steps on CudaFp8Linear (the codes' consumers), not the W8A16 fold.
    setenv("TANDEM_FP8_W16_TOKENS", "1", /*overwrite=*/1);
    for (int i = 0; i < 2; ++i) {  // shared / fused codes, then a pass each
      setenv("TANDEM_FP8_GROUP_CODES", i == 0 ? "1" : "0", /*overwrite=*/1);
      ModelWeights w = RandomModelWeights(model, seed);
      ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
      outs[i] = RunPrompts(model, std::move(w), prompts, 10, &factory, /*together=*/true);
    }
    unsetenv("TANDEM_FP8_GROUP_CODES");
    unsetenv("TANDEM_FP8_W16_TOKENS");
    for (size_t p = 0; p < prompts.size(); ++p) {
      ASSERT_EQ(outs[0][p].tokens.size(), 10u) << "prompt " << p;
      EXPECT_EQ(outs[0][p].tokens, outs[1][p].tokens) << "prompt " << p;
      EXPECT_EQ(outs[0][p].logits, outs[1][p].logits) << "prompt " << p;
    }
  }
}

// TANDEM_FP8_DECODE_GEMM (cuda_fp8_linear.h): an online-FP8 model (per-channel weights, per-token
// activations) whose prompts of 9-60 tokens, one at a time, run each prefill's projections on the
// swapped CUTLASS GEMM (=swap: whole, and split along k, as MidConfig's weights have few 128-row
// tiles) agrees with the same prefills on the GEMV (<= 16 rows) and cuBLASLt (=gemv, the choice
// before it): the same weights, the FP8 tensor cores' partial sums (a few 2^-13 of each 32-product
// MMA) in place of the GEMV's fp32 ones; the next projection's per-token quantization turns such
// differences into whole e4m3 steps of a few activations, so the last-prompt logits agree to FP8
// activation noise, as Fp8WeightOnlyFold's per-token case (cosine >= 0.99, within 0.1 of the
// largest logit), and their argmax where the top two are apart. Batch-1 decode steps run the GEMV
// either way. (Measured on an H200, 5 seeds: the 17-60-token prompts' logits equal to cuBLASLt's
// bit for bit, so on these shapes its FP8 kernels sum in the same order; the 9-16-token ones,
// against the GEMV, at cosine >= 0.9991, within 0.045 of the largest logit.)
TEST(CudaEngineTest, Fp8SwapGemmAgreesWithTheGemvAndCublasLt) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CudaFp8Linear::RowGemmAvailable()) GTEST_SKIP() << "no CUTLASS GEMM (build or device)";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig model = engine_test::MidConfig();
  model.quantization.method = WeightQuantization::Method::kOnlineFp8;
  model.quantization.block_rows = 1;
  model.quantization.activation = kernels::Fp8ActivationScheme::kDynamicToken;
  auto prompts = RandomPrompts(6, 60, static_cast<int>(model.vocab_size), seed);
  const size_t lengths[] = {9, 12, 16, 17, 33, 60};
  for (size_t p = 0; p < prompts.size(); ++p) {
    while (prompts[p].size() < lengths[p]) prompts[p].push_back(prompts[p][0]);
    prompts[p].resize(lengths[p]);
  }
  CudaBackendConfig backend = MidBackend();
  backend.gemm_autotune = false;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  std::vector<Output> outs[2];
  for (int i = 0; i < 2; ++i) {
    setenv("TANDEM_FP8_DECODE_GEMM", i == 0 ? "swap" : "gemv", /*overwrite=*/1);
    ModelWeights w = RandomModelWeights(model, seed);
    ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
    outs[i] = RunPrompts(model, std::move(w), prompts, 2, &factory, /*together=*/false);
  }
  unsetenv("TANDEM_FP8_DECODE_GEMM");
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << prompts[p].size() << " tokens");
    const std::vector<float>& got = outs[0][p].logits;
    const std::vector<float>& want = outs[1][p].logits;
    ASSERT_EQ(got.size(), want.size());
    ASSERT_FALSE(got.empty());
    const float max_abs = MaxAbs(want);
    float worst = 0.0f;
    for (size_t v = 0; v < want.size(); ++v) worst = std::max(worst, std::fabs(got[v] - want[v]));
    std::printf("  %zu tokens: cosine %.6f, largest difference %.4f of max |logit|\n",
                prompts[p].size(), Cosine(got, want), worst / max_abs);
    EXPECT_GE(Cosine(got, want), 0.99);
    EXPECT_LE(worst, 0.1f * max_abs);
    std::vector<float> sorted = want;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 0.2f * max_abs) {
      EXPECT_EQ(ArgMax(got), ArgMax(want));
      EXPECT_EQ(outs[0][p].tokens[0], outs[1][p].tokens[0]);
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

}  // namespace
}  // namespace tandem::runtime::cuda
