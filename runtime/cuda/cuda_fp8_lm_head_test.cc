// An FP8 lm_head on the CUDA backend (WeightQuantization::lm_head, --quantize_lm_head; GPU, skips
// without one): CudaLlamaModel::LmHeadFp8 against the CPU engine on the same weights, one
// request at a time (every logits row alone: the weight-only W8A16 GEMV at batch 1) and all
// together (rows batched: CudaFp8Linear into bf16, widened). With every FP8 weight weight-only
// the CPU multiplies the dequantized weights exactly as the GPU kernels do up to summation order
// and bf16 logits (cosine >= 0.9999); with per-token activations the GPU's batch-1 products stay
// weight-only where the CPU's quantize (cosine >= 0.99). A 16-bit head gives other logits. The
// device dummy draw (untied and tied heads) computes what the host draw uploaded computes. The
// decode split merge defaults to the cluster form for FP8 weights only.
#include <random>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_engine_test_util.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

using engine_cuda_test::Cosine;
using engine_cuda_test::MidBackend;
using engine_cuda_test::Output;
using engine_cuda_test::RandomPrompts;
using engine_cuda_test::RunPrompts;
using engine_cuda_test::ScaledRandomWeights;
using Scheme = kernels::Fp8ActivationScheme;

ModelConfig HeadConfig(Scheme act, bool lm_head = true) {
  ModelConfig model = engine_test::MidConfig();
  model.quantization.method = WeightQuantization::Method::kOnlineFp8;
  model.quantization.block_rows = 1;
  model.quantization.activation = act;
  model.quantization.lm_head = lm_head;
  return model;
}

ModelWeights Quantized(const ModelConfig& model, uint32_t seed) {
  ModelWeights w = ScaledRandomWeights(model, seed);
  EXPECT_TRUE(QuantizeWeightsFp8(model, &w).ok());
  return w;
}

TEST(CudaFp8LmHeadTest, AgreesWithTheCpuEngineAloneAndBatched) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const Scheme act : {Scheme::kNone, Scheme::kDynamicToken}) {
    SCOPED_TRACE(act == Scheme::kNone ? "weight-only" : "per-token activations");
    const ModelConfig model = HeadConfig(act);
    auto prompts = RandomPrompts(5, 50, static_cast<int>(model.vocab_size), seed);
    prompts[0].resize(1);
    CudaBackendConfig backend = MidBackend();
    backend.gemm_autotune = false;
    const ExecutorFactory factory = CudaExecutorFactory(backend);
    const auto cpu = RunPrompts(model, Quantized(model, seed), prompts, 6, nullptr, true);
    const auto alone = RunPrompts(model, Quantized(model, seed), prompts, 6, &factory, false);
    const auto batched = RunPrompts(model, Quantized(model, seed), prompts, 6, &factory, true);
    const ModelConfig head16 = HeadConfig(act, false);
    const auto other = RunPrompts(head16, Quantized(head16, seed), prompts, 6, &factory, false);
    const double bound = act == Scheme::kNone ? 0.9999 : 0.99;
    for (size_t p = 0; p < prompts.size(); ++p) {
      SCOPED_TRACE(::testing::Message() << "prompt " << p);
      ASSERT_EQ(cpu[p].logits.size(), static_cast<size_t>(model.vocab_size));
      ASSERT_EQ(alone[p].tokens.size(), 6u);
      ASSERT_EQ(batched[p].tokens.size(), 6u);
      EXPECT_GE(Cosine(alone[p].logits, cpu[p].logits), bound);
      EXPECT_GE(Cosine(batched[p].logits, cpu[p].logits), bound);
      EXPECT_NE(alone[p].logits, other[p].logits) << "the 16-bit head's logits";
    }
  }
}

// CudaBackendConfig::decode_cluster_merge unset: the cluster merge for FP8 weights (with or
// without an FP8 head), the merge kernel for 16-bit ones.
TEST(CudaFp8LmHeadTest, ClusterMergeByDefaultForFp8Weights) {
  TANDEM_SKIP_WITHOUT_GPU();
  const ModelConfig plain = engine_test::MidConfig();
  const auto prompts = RandomPrompts(4, 600, static_cast<int>(plain.vocab_size), 29);
  CudaBackendConfig backend = MidBackend();
  backend.gemm_autotune = false;
  ASSERT_FALSE(backend.decode_cluster_merge.has_value());
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  for (const ModelConfig& model :
       {HeadConfig(Scheme::kDynamicToken), HeadConfig(Scheme::kDynamicToken, false), plain}) {
    SCOPED_TRACE(model.quantization.Describe());
    ExecutorStats stats;
    ModelWeights w = RandomModelWeights(model, 3);
    ASSERT_TRUE(QuantizeWeightsFp8(model, &w).ok());
    RunPrompts(model, std::move(w), prompts, 8, &factory, true, &stats);
    EXPECT_GT(stats.graph_steps, 0);
    if (model.quantization.IsFp8()) {
      EXPECT_GT(stats.split_merge_cluster_steps, 0);
    } else {
      EXPECT_EQ(stats.split_merge_cluster_steps, 0);
    }
  }
}

TEST(CudaFp8LmHeadTest, DeviceDummyHeadIsTheHostDraw) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModelConfig model = HeadConfig(Scheme::kDynamicToken);
    model.tie_word_embeddings = tied;
    CudaBackendConfig on_device = MidBackend();
    on_device.dummy_seed = 5;
    const ExecutorFactory device_factory = CudaExecutorFactory(on_device);
    const ExecutorFactory host_factory = CudaExecutorFactory(MidBackend());
    const auto prompts = RandomPrompts(4, 40, static_cast<int>(model.vocab_size), 13);
    ModelWeights host = RandomModelWeights(model, 5);
    ASSERT_TRUE(QuantizeWeightsFp8(model, &host).ok());
    const auto a = RunPrompts(model, ModelWeights{}, prompts, 4, &device_factory, true);
    const auto b = RunPrompts(model, std::move(host), prompts, 4, &host_factory, true);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_FALSE(a[i].logits.empty());
      EXPECT_GE(Cosine(a[i].logits, b[i].logits), 0.9999) << "prompt " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::runtime::cuda
