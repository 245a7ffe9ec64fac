// Runs the make_dummy_model binary as a user would and loads what it wrote.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/half.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string output;
};

class MakeDummyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device()();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("make_dummy_", ::getpid(), "_", seed_);
    fs::create_directories(dir_);
    const char* srcdir = std::getenv("TEST_SRCDIR");
    ASSERT_NE(srcdir, nullptr) << "run under bazel test";
    binary_ = fs::path(srcdir) / "tandem" / "runtime" / "model" / "make_dummy_model";
    ASSERT_TRUE(fs::exists(binary_)) << binary_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Run(const std::string& args) {
    Result result;
    const std::string command = absl::StrCat(binary_.string(), " ", args, " 2>&1");
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return result;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
  }

  // Runs make_dummy_model `args` with --threads=1 into `one` and --threads=`threads` into `many`,
  // expects every file of the two byte-equal and returns the .safetensors files written (-1 when
  // a run failed).
  int WriteWithOneAndManyThreads(const std::string& args, int threads, const fs::path& one,
                                 const fs::path& many);

  uint32_t seed_ = 0;
  fs::path dir_;
  fs::path binary_;
};

float ViaBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

TEST_F(MakeDummyModelTest, TinyPresetLoadsBack) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const fs::path out = dir_ / "tiny";
  const Result r = Run(
      absl::StrCat("--config=tiny --out=", out.string(), " --seed=", seed_, " --dtype=bfloat16"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("LlamaForCausalLM"));
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  ModelConfig expected = *PresetConfig("tiny");
  expected.dtype = WeightDtype::kBF16;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ModelConfigToJson(*config), ModelConfigToJson(expected));
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(out.string(), *config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ModelWeights reference = RandomModelWeights(expected, seed_);
  ASSERT_EQ(weights->embed_tokens.size(), reference.embed_tokens.size());
  for (size_t i = 0; i < reference.embed_tokens.size(); ++i) {
    ASSERT_EQ(weights->embed_tokens[i], ViaBf16(reference.embed_tokens[i])) << i;
  }
  for (size_t i = 0; i < reference.layers[1].gate_up_proj.size(); ++i) {
    ASSERT_EQ(weights->layers[1].gate_up_proj[i], ViaBf16(reference.layers[1].gate_up_proj[i]));
  }

  // The written directory works as --config too (same shapes, new seed, float32).
  const Result again = Run(absl::StrCat("--config=", out.string(),
                                        " --out=", (dir_ / "copy").string(), " --dtype=float32"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(LoadModelWeights((dir_ / "copy").string(), *LoadModelConfig(out.string())).ok());
}

TEST_F(MakeDummyModelTest, ConfigFile) {
  const fs::path config = dir_ / "qwen.json";
  std::ofstream(config) << R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 300,
      "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": true,
      "rope_theta": 1000000.0, "eos_token_id": [7, 8], "torch_dtype": "float16"})";
  const fs::path out = dir_ / "qwen";
  const Result r = Run(absl::StrCat("--config=", config.string(), " --out=", out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<ModelConfig> loaded = LoadModelConfig(out.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->dtype, WeightDtype::kF16);
  EXPECT_TRUE(loaded->qkv_bias);
  EXPECT_EQ(loaded->eos_token_ids, (std::vector<int32_t>{7, 8}));
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(out.string(), *loaded);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->lm_head.empty());
  EXPECT_EQ(weights->layers[0].qkv_bias.size(), (4u + 2) * 8);
}

// Every float of two loads, in one flat list (model vectors, then layer by layer).
std::vector<float> Flatten(const ModelWeights& w) {
  std::vector<float> out;
  auto add = [&out](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  add(w.embed_tokens);
  add(w.norm);
  add(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const std::vector<float>* v : {&l.input_layernorm, &l.qkv_proj, &l.qkv_bias, &l.o_proj,
                                        &l.o_bias, &l.post_attention_layernorm, &l.gate_up_proj,
                                        &l.gate_up_bias, &l.down_proj, &l.down_bias}) {
      add(*v);
    }
  }
  return out;
}

std::string FileBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int MakeDummyModelTest::WriteWithOneAndManyThreads(const std::string& args, int threads,
                                                   const fs::path& one, const fs::path& many) {
  const Result r1 = Run(absl::StrCat(args, " --threads=1 --out=", one.string()));
  EXPECT_EQ(r1.exit_code, 0) << r1.output;
  const Result rn = Run(absl::StrCat(args, " --threads=", threads, " --out=", many.string()));
  EXPECT_EQ(rn.exit_code, 0) << rn.output;
  if (r1.exit_code != 0 || rn.exit_code != 0) return -1;
  int files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(one)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    files += entry.path().extension() == ".safetensors";
    EXPECT_EQ(FileBytes(entry.path()), FileBytes(many / name));
  }
  return files;
}

// Item 1 of issue 31: a multi-shard checkpoint written with several writer threads is the one
// written with one, and loads bit for bit the same with 1 and N reader threads and any read
// size, whole and as a tensor-parallel rank (o_proj / down_proj: a column slice, one read per
// row), equal to the dummy draw rounded to bf16.
TEST_F(MakeDummyModelTest, ShardsWriteAndLoadTheSameWithAnyNumberOfThreads) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const fs::path config = dir_ / "config.json";
  std::ofstream(config) << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 3000,
      "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 3,
      "num_attention_heads": 8, "num_key_value_heads": 2, "torch_dtype": "bfloat16"})";
  const fs::path one = dir_ / "one", many = dir_ / "many";
  const std::string common =
      absl::StrCat("--config=", config.string(), " --seed=", seed_, " --shard_mb=1");
  ASSERT_GE(WriteWithOneAndManyThreads(common, 4, one, many), 4);  // the test needs several shards

  absl::StatusOr<ModelConfig> loaded = LoadModelConfig(many.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<float> reference = Flatten(RandomModelWeights(*loaded, seed_));
  for (const TpShard& shard : {TpShard{}, TpShard{1, 2, 1}}) {
    SCOPED_TRACE(testing::Message() << "rank " << shard.rank << " of " << shard.size);
    absl::StatusOr<ModelWeights> serial =
        LoadModelWeights(many.string(), *loaded, shard, CheckpointReadOptions{1});
    ASSERT_TRUE(serial.ok()) << serial.status();
    const std::vector<float> expected = Flatten(*serial);
    for (const CheckpointReadOptions& read :
         {CheckpointReadOptions{4}, CheckpointReadOptions{3, 4096},
          CheckpointReadOptions{5, 100}}) {
      SCOPED_TRACE(testing::Message() << read.threads << " threads, reads of " << read.chunk_bytes);
      absl::StatusOr<ModelWeights> parallel = LoadModelWeights(many.string(), *loaded, shard, read);
      ASSERT_TRUE(parallel.ok()) << parallel.status();
      const std::vector<float> got = Flatten(*parallel);
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
    }
    if (shard.size == 1) {
      ASSERT_EQ(expected.size(), reference.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_EQ(expected[i], ViaBf16(reference[i])) << i;
      }
    }
  }
}

// Issue 31 (70B from files): with fewer shards than threads, the spare threads draw a shard's
// values in 1M-element pieces (a tensor of more than one piece here: the 1.28M-element embedding
// and head) and the bytes are the one-thread writer's, as one file and as three shards, and load
// back as the dummy draw rounded to bf16.
TEST_F(MakeDummyModelTest, FewShardsWrittenByManyThreadsAreTheOneThreadShards) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const fs::path config = dir_ / "config.json";
  std::ofstream(config) << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 5000,
      "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 2, "torch_dtype": "bfloat16"})";
  for (const char* shard_mb : {"64", "3"}) {
    SCOPED_TRACE(testing::Message() << "--shard_mb=" << shard_mb);
    const fs::path one = dir_ / absl::StrCat("one", shard_mb);
    const fs::path many = dir_ / absl::StrCat("many", shard_mb);
    const std::string common =
        absl::StrCat("--config=", config.string(), " --seed=", seed_, " --shard_mb=", shard_mb);
    // One file, then three shards: fewer than the 5 threads either way.
    ASSERT_EQ(WriteWithOneAndManyThreads(common, 5, one, many),
              std::string(shard_mb) == "64" ? 1 : 3);
    absl::StatusOr<ModelConfig> loaded = LoadModelConfig(many.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    absl::StatusOr<ModelWeights> weights = LoadModelWeights(many.string(), *loaded);
    ASSERT_TRUE(weights.ok()) << weights.status();
    const std::vector<float> got = Flatten(*weights);
    const std::vector<float> reference = Flatten(RandomModelWeights(*loaded, seed_));
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ViaBf16(reference[i])) << i;
  }
}

// Every float of a layer, the MLA and MoE slots included (same order for two loads).
std::vector<float> FlattenLayer(const LayerWeights& l) {
  std::vector<float> out;
  for (const std::vector<float>* v :
       {&l.input_layernorm, &l.post_attention_layernorm, &l.gate_up_proj, &l.down_proj, &l.q_a_proj,
        &l.q_a_layernorm, &l.q_proj, &l.kv_a_proj, &l.kv_a_layernorm, &l.kv_b_proj, &l.o_proj,
        &l.router, &l.experts_gate_up, &l.experts_down, &l.shared_gate_up, &l.shared_down,
        &l.router_bias}) {
    out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

// Issue 34: a DeepSeek-V3 config with num_nextn_predict_layers = 1 (its MTP layer a MoE layer)
// is written with model.layers.2.*; the checkpoint loads with MTP off (LoadModelWeights skips
// the layer) and on (LoadMtpWeights), each bit for bit the dummy draw (--load_format=dummy's
// RandomModelWeights / RandomMtpWeights with the same seed). --mtp_layers=0 writes none.
TEST_F(MakeDummyModelTest, DeepseekMtpLayerIsTheDummyDraw) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const fs::path config_file = dir_ / "v3.json";
  std::ofstream(config_file) << R"({"architectures": ["DeepseekV3ForCausalLM"],
      "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 2, "first_k_dense_replace": 1,
      "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
      "v_head_dim": 8, "moe_intermediate_size": 8, "n_routed_experts": 4, "n_shared_experts": 1,
      "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
      "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1, "torch_dtype": "float32"})";
  const fs::path out = dir_ / "v3";
  const Result r = Run(
      absl::StrCat("--config=", config_file.string(), " --out=", out.string(), " --seed=", seed_));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->num_nextn_predict_layers, 1);
  ASSERT_TRUE(config->IsMoeLayer(2));

  absl::StatusOr<ModelWeights> model = LoadModelWeights(out.string(), *config);  // MTP off
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelWeights drawn = RandomModelWeights(*config, seed_);
  EXPECT_EQ(model->embed_tokens, drawn.embed_tokens);
  EXPECT_EQ(model->lm_head, drawn.lm_head);
  for (size_t i = 0; i < drawn.layers.size(); ++i) {
    EXPECT_EQ(FlattenLayer(model->layers[i]), FlattenLayer(drawn.layers[i])) << "layer " << i;
  }

  absl::StatusOr<MtpWeights> mtp = LoadMtpWeights(out.string(), *config);  // MTP on
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  const MtpWeights dummy = RandomMtpWeights(*config, drawn, seed_);
  EXPECT_FALSE(mtp->own_embed_tokens);
  EXPECT_FALSE(mtp->own_head);
  EXPECT_EQ(mtp->enorm, dummy.enorm);
  EXPECT_EQ(mtp->hnorm, dummy.hnorm);
  EXPECT_EQ(mtp->eh_proj, dummy.eh_proj);
  EXPECT_NE(mtp->eh_proj, std::vector<float>(mtp->eh_proj.size(), 0.0f));
  ASSERT_EQ(mtp->block.layers.size(), 1u);
  const std::vector<float> layer = FlattenLayer(mtp->block.layers[0]);
  EXPECT_EQ(layer, FlattenLayer(dummy.block.layers[0]));
  EXPECT_FALSE(mtp->block.layers[0].experts_down.empty());  // a MoE layer
  // Drawn for its own names: not a copy of the model's MoE layer 1.
  EXPECT_NE(layer, FlattenLayer(drawn.layers[1]));
  EXPECT_EQ(mtp->block.norm, dummy.block.norm);
  EXPECT_EQ(mtp->block.embed_tokens, dummy.block.embed_tokens);
  EXPECT_EQ(mtp->block.lm_head, dummy.block.lm_head);
  // --load_format=dummy's draw, which skips the model's layers, is the same bit for bit.
  const MtpWeights lean = RandomMtpWeights(*config, seed_);
  EXPECT_EQ(lean.eh_proj, dummy.eh_proj);
  EXPECT_EQ(FlattenLayer(lean.block.layers[0]), layer);
  EXPECT_EQ(lean.block.embed_tokens, dummy.block.embed_tokens);
  EXPECT_EQ(lean.block.lm_head, dummy.block.lm_head);

  const fs::path plain = dir_ / "v3_plain";
  const Result none = Run(absl::StrCat("--config=", config_file.string(), " --out=", plain.string(),
                                       " --mtp_layers=0"));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  absl::StatusOr<ModelConfig> plain_config = LoadModelConfig(plain.string());
  ASSERT_TRUE(plain_config.ok()) << plain_config.status();
  EXPECT_EQ(plain_config->num_nextn_predict_layers, 0);
  EXPECT_LT(fs::file_size(plain / "model.safetensors"), fs::file_size(out / "model.safetensors"));
}

TEST_F(MakeDummyModelTest, BadInputExitsNonZeroWithAMessage) {
  const std::string out = absl::StrCat(" --out=", (dir_ / "bad").string());
  const fs::path yarn = dir_ / "yarn.json";
  std::ofstream(yarn) << R"({"architectures": ["LlamaForCausalLM"],
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--config=tiny", "--out is required"},
      {"--out=/tmp/x", "--config is required"},
      {"--config=no-such-preset" + out, "neither a file"},
      {"--config=tiny --dtype=int8" + out, "unsupported dtype 'int8'"},
      {"--config=tiny --shard_mb=0" + out, "--shard_mb"},
      {"--config=" + yarn.string() + out, "unsupported rope type 'yarn'"},
      {"--config=tiny --seed=abc" + out, "seed"},
      {"--config=tiny stray" + out, "unexpected argument"},
      {"--config=tiny --mtp_layers=1" + out, "has no MTP layers"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    const Result r = Run(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(needle));
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "model.safetensors"));
}

}  // namespace
}  // namespace tandem::runtime
