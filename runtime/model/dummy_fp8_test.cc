// Dummy weights of a 128 x 128-block FP8 config (RandomModelWeights -> QuantizeWeightsFp8; the
// CUDA backend draws the same on the device): one scale per 128 x 128 tile of each checkpoint
// tensor, as DeepSeek-V3's and Qwen3-FP8's checkpoints hold them. The test writes the plain
// (fp32) dummy checkpoint of the same seed as such an FP8 checkpoint would be made (each
// projection quantized whole by kernels::QuantizeWeight over 128 x 128 blocks: F8_E4M3 codes and
// an F32 weight_scale_inv of [ceil(n / 128), ceil(k / 128)], the shape the loader checks), loads
// it with LoadModelWeights, and requires the dummy draw to equal the load bit for bit: codes,
// per-row scales (a tile's rows holding its scale, tiles restarting at each fused part: gate and
// up of 192 rows), and kv_b_proj dequantized into fp32. Before: the draw had per-row 1 x 128
// groups (scales differ) and refused DeepSeek's MLA.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/fp8/fp8.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;

// The projections an FP8 checkpoint stores as e4m3 (the router, embeddings, norms and lm_head
// stay 16/32-bit).
bool IsFp8Projection(const TensorInfo& t) {
  return t.shape.size() == 2 && !absl::StartsWith(t.name, "lm_head") &&
         (absl::EndsWith(t.name, "_proj.weight") || absl::EndsWith(t.name, "_with_mqa.weight"));
}

// `dir`/model.safetensors: the fp32 dummy checkpoint of `plain` (seed) with every projection
// quantized over 128 x 128 blocks.
void WriteBlockCheckpoint(const ModelConfig& plain, uint64_t seed, const std::string& dir) {
  const std::string fp32_dir = dir + "_fp32";
  ASSERT_TRUE(WriteDummyModel(plain, fp32_dir, seed).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> in =
      SafetensorsFile::Open(fp32_dir + "/model.safetensors");
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> raw;
  for (const TensorInfo& t : (*in)->tensors()) {
    ASSERT_EQ(t.dtype, SafetensorsDtype::kF32) << t.name;
    if (!IsFp8Projection(t)) {
      specs.push_back({t.name, t.dtype, t.shape});
      continue;
    }
    specs.push_back({t.name, SafetensorsDtype::kOther, t.shape});
    raw[t.name] = "F8_E4M3";
    const std::string scales = t.name.substr(0, t.name.size() - 6) + "weight_scale_inv";
    specs.push_back(
        {scales, SafetensorsDtype::kF32, {(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128}});
  }
  fs::create_directories(dir);
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> out = SafetensorsWriter::Create(
      dir + "/model.safetensors", std::move(specs), {{"format", "pt"}}, raw);
  ASSERT_TRUE(out.ok()) << out.status();
  for (const TensorInfo& t : (*in)->tensors()) {
    if (!IsFp8Projection(t)) {
      ASSERT_TRUE((*out)->AppendBytes(t.data, t.nbytes).ok());
      continue;
    }
    const kernels::Fp8ScaleGrid blocks{t.shape[0], t.shape[1], 128, 128};
    std::vector<float> w(static_cast<size_t>(t.nbytes / 4));
    std::memcpy(w.data(), t.data, static_cast<size_t>(t.nbytes));
    std::vector<uint8_t> codes(w.size());
    std::vector<float> scales(static_cast<size_t>(blocks.NumScales()));
    kernels::QuantizeWeight(w.data(), blocks, codes.data(), scales.data());
    ASSERT_TRUE((*out)->AppendBytes(codes.data(), static_cast<int64_t>(codes.size())).ok());
    ASSERT_TRUE((*out)->AppendFloats(scales.data(), static_cast<int64_t>(scales.size())).ok());
  }
  ASSERT_TRUE((*out)->Finish().ok());
}

void ExpectEqual(const Fp8LinearWeight& draw, const Fp8LinearWeight& load,
                 const std::string& what) {
  EXPECT_EQ(draw.grid.rows, load.grid.rows) << what;
  EXPECT_EQ(draw.grid.cols, load.grid.cols) << what;
  EXPECT_EQ(draw.grid.block_rows, load.grid.block_rows) << what;
  EXPECT_EQ(draw.grid.block_cols, load.grid.block_cols) << what;
  EXPECT_EQ(draw.activation, load.activation) << what;
  EXPECT_TRUE(draw.codes == load.codes) << what << ": codes differ";
  EXPECT_TRUE(draw.scales == load.scales) << what << ": scales differ";
}

// Draws `config` (a 128 x 128-block FP8 config), loads its block checkpoint, compares.
void DrawEqualsTheLoad(const ModelConfig& config, uint64_t seed, const std::string& name) {
  ASSERT_TRUE(Fp8QuantizesTiles(config.quantization));
  ModelConfig plain = config;
  plain.quantization = WeightQuantization();
  const std::string dir = ::testing::TempDir() + "/dummy_fp8_" + name;
  WriteBlockCheckpoint(plain, seed, dir);
  absl::StatusOr<ModelWeights> load = LoadModelWeights(dir, config);
  ASSERT_TRUE(load.ok()) << load.status();
  absl::StatusOr<ModelWeights> draw = RandomModelWeights(config, seed, TpShard{});
  ASSERT_TRUE(draw.ok()) << draw.status();
  ASSERT_EQ(draw->layers.size(), load->layers.size());
  int64_t fp8_weights = 0;
  for (size_t l = 0; l < draw->layers.size(); ++l) {
    const LayerWeights& d = draw->layers[l];
    const LayerWeights& w = load->layers[l];
    const std::pair<const char*, Fp8LinearWeight LayerWeights::*> slots[] = {
        {"qkv", &LayerWeights::qkv_fp8},
        {"o", &LayerWeights::o_fp8},
        {"gate_up", &LayerWeights::gate_up_fp8},
        {"down", &LayerWeights::down_fp8},
        {"experts gate_up", &LayerWeights::experts_gate_up_fp8},
        {"experts down", &LayerWeights::experts_down_fp8},
        {"shared gate_up", &LayerWeights::shared_gate_up_fp8},
        {"shared down", &LayerWeights::shared_down_fp8},
        {"q_a", &LayerWeights::q_a_fp8},
        {"q", &LayerWeights::q_fp8},
        {"kv_a", &LayerWeights::kv_a_fp8},
        {"kv_b", &LayerWeights::kv_b_fp8}};
    for (const auto& [what, slot] : slots) {
      ExpectEqual(d.*slot, w.*slot, absl::StrCat(name, " layer ", l, " ", what));
      fp8_weights += !(d.*slot).empty();
    }
    // Read as e4m3, so no fp32 copy; kv_b_proj is used absorbed: the loader widens it.
    for (const std::vector<float>* fp32 :
         {&d.qkv_proj, &d.gate_up_proj, &d.experts_gate_up, &d.q_a_proj, &d.q_proj, &d.kv_a_proj}) {
      EXPECT_TRUE(fp32->empty()) << name << " layer " << l;
    }
    EXPECT_TRUE(d.kv_b_proj == w.kv_b_proj) << name << " layer " << l << " kv_b_proj";
    EXPECT_TRUE(d.router == w.router) << name << " layer " << l << " router";
  }
  EXPECT_GE(fp8_weights, 2 * static_cast<int64_t>(draw->layers.size())) << name;
}

TEST(DummyFp8Test, BlockDrawIsWhatTheLoaderHoldsForABlockCheckpoint) {
  // Qwen3-30B-A3B-FP8's scheme on a tiny Qwen3-MoE with partial tiles everywhere: hidden 320
  // (three column groups, the last half full), experts of 192 rows (up starts inside a tile).
  absl::StatusOr<ModelConfig> moe = PresetConfig("tiny-moe");
  ASSERT_TRUE(moe.ok()) << moe.status();
  moe->hidden_size = 320;
  moe->moe_intermediate_size = 192;
  moe->quantization = PresetConfig("qwen3-30b-a3b-fp8")->quantization;
  DrawEqualsTheLoad(*moe, 11, "moe");

  // DeepSeek-V3's format (tiny-mla-fp8) widened past one tile: q_a 160 rows, the latent
  // 160 + 8 rows (kv_a_proj_with_mqa), hidden 288, a dense MLP of 320.
  absl::StatusOr<ModelConfig> mla = PresetConfig("tiny-mla-fp8");
  ASSERT_TRUE(mla.ok()) << mla.status();
  EXPECT_TRUE(Fp8QuantizesTiles(mla->quantization));
  mla->hidden_size = 288;
  mla->intermediate_size = 320;
  mla->q_lora_rank = 160;
  mla->kv_lora_rank = 160;
  DrawEqualsTheLoad(*mla, 12, "mla");
}

}  // namespace
}  // namespace tandem::runtime
