// Mixture-of-experts and Qwen3 weights: a dummy checkpoint written in the hub's per-expert layout
// loads back to RandomModelWeights exactly (experts stacked per layer, dense layers keeping their
// MLP), tensor-parallel ranks hold the slices of every expert cut here independently, a missing
// expert tensor is refused by name, and the MoE presets have their models' sizes.
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

ModelConfig TinyMoe(const std::string& architecture) {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny-moe");
  EXPECT_TRUE(c.ok()) << c.status();
  c->architecture = architecture;
  c->num_hidden_layers = 3;
  if (architecture == "Qwen2MoeForCausalLM") {
    c->qk_norm = false;
    c->qkv_bias = true;
    c->shared_expert_intermediate_size = 48;
    c->norm_topk_prob = false;
    c->mlp_only_layers = {0};
  } else if (architecture == "MixtralForCausalLM") {
    c->qk_norm = false;
    c->moe_intermediate_size = c->intermediate_size;
  }
  EXPECT_TRUE(ValidateModelConfig(*c).ok()) << ValidateModelConfig(*c);
  return *c;
}

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / name;
  fs::remove_all(dir);
  return dir.string();
}

TEST(MoeWeightsTest, DummyCheckpointLoadsBackExactly) {
  const uint64_t seed = 1000 + std::random_device()() % 1000;
  SCOPED_TRACE(seed);
  for (const char* arch : {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"}) {
    SCOPED_TRACE(arch);
    const ModelConfig c = TinyMoe(arch);
    const std::string dir = TempDir(arch);
    ASSERT_TRUE(WriteDummyModel(c, dir, seed).ok());
    absl::StatusOr<ModelConfig> read = LoadModelConfig(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    absl::StatusOr<ModelWeights> loaded = LoadModelWeights(dir, *read);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const ModelWeights want = RandomModelWeights(c, seed);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerWeights& a = loaded->layers[l];
      const LayerWeights& b = want.layers[l];
      EXPECT_EQ(a.router, b.router) << l;
      EXPECT_EQ(a.experts_gate_up, b.experts_gate_up) << l;
      EXPECT_EQ(a.experts_down, b.experts_down) << l;
      EXPECT_EQ(a.shared_gate_up, b.shared_gate_up) << l;
      EXPECT_EQ(a.shared_down, b.shared_down) << l;
      EXPECT_EQ(a.shared_expert_gate, b.shared_expert_gate) << l;
      EXPECT_EQ(a.q_norm, b.q_norm) << l;
      EXPECT_EQ(a.gate_up_proj, b.gate_up_proj) << l;
      EXPECT_EQ(a.qkv_proj, b.qkv_proj) << l;
      const bool sparse = c.IsMoeLayer(l);
      EXPECT_EQ(a.router.size(), sparse ? static_cast<size_t>(c.num_experts * c.hidden_size) : 0);
      EXPECT_EQ(
          a.experts_gate_up.size(),
          sparse ? static_cast<size_t>(c.num_experts * 2 * c.moe_intermediate_size * c.hidden_size)
                 : 0);
      EXPECT_EQ(a.gate_up_proj.empty(), sparse) << l;
      EXPECT_EQ(a.q_norm.size(), c.qk_norm ? static_cast<size_t>(c.head_dim) : 0);
      EXPECT_EQ(a.shared_expert_gate.empty(), !sparse || c.shared_expert_intermediate_size == 0);
    }
    // The experts are distinct random tensors, not copies of one another.
    const LayerWeights& last = want.layers.back();
    const size_t per_expert = last.experts_gate_up.size() / c.num_experts;
    EXPECT_FALSE(std::equal(last.experts_gate_up.begin(), last.experts_gate_up.begin() + per_expert,
                            last.experts_gate_up.begin() + per_expert));
  }
}

TEST(MoeWeightsTest, TpRanksHoldSlicesOfEveryExpert) {
  const uint64_t seed = 77;
  const ModelConfig c = TinyMoe("Qwen2MoeForCausalLM");
  const std::string dir = TempDir("tp_moe");
  ASSERT_TRUE(WriteDummyModel(c, dir, seed).ok());
  const ModelWeights full = RandomModelWeights(c, seed);
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t S = c.shared_expert_intermediate_size;
  for (int n : {2, 4}) {
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", n));
      absl::StatusOr<ModelWeights> shard = LoadModelWeights(dir, c, TpShard{r, n});
      ASSERT_TRUE(shard.ok()) << shard.status();
      const int64_t li = I / n, ls = S / n;
      for (int64_t l = 1; l < c.num_hidden_layers; ++l) {  // layer 0 is dense (mlp_only_layers)
        const LayerWeights& got = shard->layers[l];
        const LayerWeights& all = full.layers[l];
        EXPECT_EQ(got.router, all.router);  // replicated
        EXPECT_EQ(got.shared_expert_gate, all.shared_expert_gate);
        ASSERT_EQ(got.experts_gate_up.size(), static_cast<size_t>(E * 2 * li * H));
        ASSERT_EQ(got.experts_down.size(), static_cast<size_t>(E * H * li));
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t half = 0; half < 2; ++half) {  // gate rows, then up rows
            for (int64_t i = 0; i < li; ++i) {
              for (int64_t h = 0; h < H; ++h) {
                ASSERT_EQ(got.experts_gate_up[((e * 2 + half) * li + i) * H + h],
                          all.experts_gate_up[((e * 2 + half) * I + r * li + i) * H + h]);
              }
            }
          }
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < li; ++i) {
              ASSERT_EQ(got.experts_down[(e * H + h) * li + i],
                        all.experts_down[(e * H + h) * I + r * li + i]);
            }
          }
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < ls; ++i) {
            ASSERT_EQ(got.shared_down[h * ls + i], all.shared_down[h * S + r * ls + i]);
            ASSERT_EQ(got.shared_gate_up[(ls + i) * H + h],
                      all.shared_gate_up[(S + r * ls + i) * H + h]);
          }
        }
      }
      // Dummy weights drawn per rank are the same slices.
      absl::StatusOr<ModelWeights> drawn = RandomModelWeights(c, seed, TpShard{r, n});
      ASSERT_TRUE(drawn.ok()) << drawn.status();
      EXPECT_EQ(drawn->layers[2].experts_gate_up, shard->layers[2].experts_gate_up);
      EXPECT_EQ(drawn->layers[2].experts_down, shard->layers[2].experts_down);
    }
  }
}

TEST(MoeWeightsTest, MissingExpertTensorIsNamed) {
  const ModelConfig c = TinyMoe("MixtralForCausalLM");
  const std::string dir = TempDir("missing_expert");
  ASSERT_TRUE(WriteDummyModel(c, dir, 5).ok());
  // Rewrite the file without one expert's w3 (the dummy model is f32: raw floats).
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> keep;
  const std::string dropped = "model.layers.1.block_sparse_moe.experts.3.w3.weight";
  bool seen = false;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    values.reserve((*file)->tensors().size());
    for (const TensorInfo& t : (*file)->tensors()) {
      if (t.name == dropped) {
        seen = true;
        continue;
      }
      ASSERT_EQ(t.dtype, SafetensorsDtype::kF32);
      values.emplace_back(t.nbytes / sizeof(float));
      std::memcpy(values.back().data(), t.data, t.nbytes);
      keep.push_back(TensorToWrite{t.name, t.dtype, t.shape, values.back().data()});
    }
  }
  ASSERT_TRUE(seen);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", keep).ok());
  absl::StatusOr<ModelWeights> w = LoadModelWeights(dir, c);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr(dropped));
}

TEST(MoeWeightsTest, PresetsHaveTheirModelsSizes) {
  absl::StatusOr<ModelConfig> qwen = PresetConfig("qwen3-30b-a3b");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_NEAR(static_cast<double>(qwen->NumParameters()), 30.53e9, 0.05e9);
  absl::StatusOr<ModelConfig> mixtral = PresetConfig("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_NEAR(static_cast<double>(mixtral->NumParameters()), 46.70e9, 0.05e9);
  EXPECT_THAT(std::string(PresetConfig("mixtral").status().message()), HasSubstr("tiny-moe"));
}

}  // namespace
}  // namespace tandem::runtime
