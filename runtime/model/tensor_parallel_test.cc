// Tensor-parallel shards: the topology rules, and every rank's weights (random and loaded from a
// safetensors directory) equal to the slices of the full model cut here independently.
#include "runtime/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/dummy_draw.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

ModelConfig Config(int64_t heads, int64_t kv_heads) {
  ModelConfig c = *PresetConfig("tiny");  // hidden 64, inter 128, vocab 256
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 8;
  c.vocab_size = 250;  // not divisible by 4: the last partition is padded
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_word_embeddings = false;
  EXPECT_TRUE(ValidateModelConfig(c).ok());
  return c;
}

TEST(TensorParallelTest, TopologyRulesNameTheNumbers) {
  const ModelConfig c = Config(8, 2);
  auto bad_heads = ComputeTpDims(c, {0, 3});
  ASSERT_FALSE(bad_heads.ok());
  EXPECT_NE(bad_heads.status().message().find("--tp=3 does not divide the model's 8 attention"),
            std::string::npos)
      << bad_heads.status();
  ModelConfig odd_kv = Config(12, 3);
  auto bad_kv = ComputeTpDims(odd_kv, {0, 2});
  ASSERT_FALSE(bad_kv.ok());
  EXPECT_NE(bad_kv.status().message().find("3 KV heads"), std::string::npos) << bad_kv.status();
  ModelConfig odd_inter = c;
  odd_inter.intermediate_size = 100;
  EXPECT_FALSE(ComputeTpDims(odd_inter, {0, 8}).ok());
  EXPECT_FALSE(ComputeTpDims(c, {2, 2}).ok());
  EXPECT_FALSE(ComputeTpDims(c, {0, 0}).ok());

  // Replicated KV heads (2 KV heads over 4 ranks): ranks 0,1 share head 0; 2,3 head 1.
  for (int r = 0; r < 4; ++r) {
    auto d = ComputeTpDims(c, {r, 4});
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(d->kv_replicated);
    EXPECT_EQ(d->kv_heads, 1);
    EXPECT_EQ(d->kv_head_begin, r / 2);
    EXPECT_EQ(d->q_heads, 2);
    // The rank's query heads all belong to the group of its KV head (4 q heads per KV head).
    EXPECT_EQ(d->q_head_begin / 4, d->kv_head_begin);
    EXPECT_EQ(d->vocab_rows, 63);
    EXPECT_EQ(d->adds_row_parallel_bias, r == 0);
  }
  EXPECT_NE(DescribeTp(c, 4).find("replicated on 2 ranks"), std::string::npos) << DescribeTp(c, 4);
  auto local = LocalModelConfig(c, {1, 2});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->num_attention_heads, 4);
  EXPECT_EQ(local->num_key_value_heads, 1);
  EXPECT_EQ(local->intermediate_size, 64);
  EXPECT_EQ(local->vocab_size, 250);
}

// rows [begin, begin + count) of a row-major [rows, cols] matrix (zero rows past its end).
std::vector<float> Rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t count,
                        int64_t total_rows) {
  std::vector<float> out(count * cols, 0.0f);
  for (int64_t r = 0; r < count && begin + r < total_rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = m[(begin + r) * cols + j];
  }
  return out;
}

std::vector<float> Cols(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t count) {
  const int64_t rows = static_cast<int64_t>(m.size()) / cols;
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < count; ++j) out.push_back(m[r * cols + begin + j]);
  }
  return out;
}

std::vector<float> Concat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// What rank r of n must hold, cut from the full weights.
ModelWeights ExpectedShard(const ModelConfig& c, const ModelWeights& full, int r, int n) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads;
  const int64_t hkv = c.num_key_value_heads, inter = c.intermediate_size;
  const int64_t lq = hq / n, lkv = hkv >= n ? hkv / n : 1;
  const int64_t kv0 = hkv >= n ? r * lkv : r / (n / hkv);
  const int64_t li = inter / n, p = (c.vocab_size + n - 1) / n;
  ModelWeights w;
  w.embed_tokens = Rows(full.embed_tokens, h, r * p, p, c.vocab_size);
  w.lm_head = Rows(full.lm_head, h, r * p, p, c.vocab_size);
  w.norm = full.norm;
  for (const LayerWeights& f : full.layers) {
    LayerWeights l;
    l.input_layernorm = f.input_layernorm;
    l.post_attention_layernorm = f.post_attention_layernorm;
    const int64_t rows = hq * d + 2 * hkv * d;
    l.qkv_proj = Concat({Rows(f.qkv_proj, h, r * lq * d, lq * d, rows),
                         Rows(f.qkv_proj, h, hq * d + kv0 * d, lkv * d, rows),
                         Rows(f.qkv_proj, h, (hq + hkv) * d + kv0 * d, lkv * d, rows)});
    l.qkv_bias = Concat({Rows(f.qkv_bias, 1, r * lq * d, lq * d, rows),
                         Rows(f.qkv_bias, 1, hq * d + kv0 * d, lkv * d, rows),
                         Rows(f.qkv_bias, 1, (hq + hkv) * d + kv0 * d, lkv * d, rows)});
    l.o_proj = Cols(f.o_proj, hq * d, r * lq * d, lq * d);
    if (r == 0) l.o_bias = f.o_bias;
    l.gate_up_proj = Concat({Rows(f.gate_up_proj, h, r * li, li, 2 * inter),
                             Rows(f.gate_up_proj, h, inter + r * li, li, 2 * inter)});
    l.gate_up_bias = Concat({Rows(f.gate_up_bias, 1, r * li, li, 2 * inter),
                             Rows(f.gate_up_bias, 1, inter + r * li, li, 2 * inter)});
    l.down_proj = Cols(f.down_proj, inter, r * li, li);
    if (r == 0) l.down_bias = f.down_bias;
    w.layers.push_back(std::move(l));
  }
  return w;
}

void ExpectSameWeights(const ModelWeights& a, const ModelWeights& b, const std::string& what) {
  EXPECT_EQ(a.embed_tokens, b.embed_tokens) << what;
  EXPECT_EQ(a.lm_head, b.lm_head) << what;
  EXPECT_EQ(a.norm, b.norm) << what;
  ASSERT_EQ(a.layers.size(), b.layers.size()) << what;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    EXPECT_EQ(x.input_layernorm, y.input_layernorm) << what << " layer " << i;
    EXPECT_EQ(x.qkv_proj, y.qkv_proj) << what << " layer " << i;
    EXPECT_EQ(x.qkv_bias, y.qkv_bias) << what << " layer " << i;
    EXPECT_EQ(x.o_proj, y.o_proj) << what << " layer " << i;
    EXPECT_EQ(x.o_bias, y.o_bias) << what << " layer " << i;
    EXPECT_EQ(x.post_attention_layernorm, y.post_attention_layernorm) << what << " layer " << i;
    EXPECT_EQ(x.gate_up_proj, y.gate_up_proj) << what << " layer " << i;
    EXPECT_EQ(x.gate_up_bias, y.gate_up_bias) << what << " layer " << i;
    EXPECT_EQ(x.down_proj, y.down_proj) << what << " layer " << i;
    EXPECT_EQ(x.down_bias, y.down_bias) << what << " layer " << i;
  }
}

TEST(TensorParallelTest, ShardsAreSlicesOfTheFullModel) {
  const std::string dir = ::testing::TempDir() + "/tp_shards";
  for (auto [heads, kv] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}, {4, 4}}) {
    const ModelConfig c = Config(heads, kv);
    const ModelWeights full = RandomModelWeights(c, 11);
    ASSERT_TRUE(WriteDummyModel(c, dir, 11, /*shard_bytes=*/40000).ok());  // several files
    for (int n : {1, 2, 4}) {
      for (int r = 0; r < n; ++r) {
        const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv) +
                                 " rank " + std::to_string(r) + " of " + std::to_string(n);
        const ModelWeights expected = ExpectedShard(c, full, r, n);
        auto random = RandomModelWeights(c, 11, TpShard{r, n});
        ASSERT_TRUE(random.ok()) << random.status();
        ExpectSameWeights(*random, expected, what + " (random)");
        auto loaded = LoadModelWeights(dir, c, TpShard{r, n});
        ASSERT_TRUE(loaded.ok()) << loaded.status();
        ExpectSameWeights(*loaded, expected, what + " (loaded)");
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// Every vector of `w` set to zero (the sizes kept).
void ZeroAll(ModelWeights* w) {
  for (std::vector<float>* v : {&w->embed_tokens, &w->norm, &w->lm_head}) {
    std::fill(v->begin(), v->end(), 0.0f);
  }
  for (LayerWeights& l : w->layers) {
    for (std::vector<float>* v : {&l.input_layernorm, &l.qkv_proj, &l.qkv_bias, &l.o_proj,
                                  &l.o_bias, &l.post_attention_layernorm, &l.gate_up_proj,
                                  &l.gate_up_bias, &l.down_proj, &l.down_bias}) {
      std::fill(v->begin(), v->end(), 0.0f);
    }
  }
}

// Host dummy draws of tensors past 1M values run on several threads (FillDummySliceParallel):
// a model tensor split by rows, an MTP tensor (drawn whole, one row) split by columns; every
// value is still the one DummyValue gives its index.
TEST(TensorParallelTest, LargeDummyTensorsDrawnOnThreadsAreTheSameValues) {
  const uint64_t seed = 0x5eed0000 + std::random_device()() % 1000;
  SCOPED_TRACE(seed);
  ModelConfig c = Config(8, 2);
  c.vocab_size = 8191;  // 2.1M embedding values; an odd row count
  c.hidden_size = 256;
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  const ModelWeights w = RandomModelWeights(c, seed);
  const uint64_t embed = DummyStreamId("model.embed_tokens.weight");
  int64_t wrong = 0;
  for (size_t i = 0; i < w.embed_tokens.size(); ++i) {
    wrong += w.embed_tokens[i] != DummyValue(seed, embed, static_cast<int64_t>(i), 0.0f);
  }
  EXPECT_EQ(wrong, 0);
  auto mla = ParseModelConfig(R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 64,
      "hidden_size": 1025, "intermediate_size": 48, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
      "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
      "first_k_dense_replace": 2, "num_nextn_predict_layers": 1, "torch_dtype": "float32"})");
  ASSERT_TRUE(mla.ok()) << mla.status();
  const MtpWeights mtp = RandomMtpWeights(*mla, seed);
  ASSERT_EQ(mtp.eh_proj.size(), 1025u * 2050u);  // 2.1M values
  const uint64_t eh = DummyStreamId("model.layers.1.eh_proj.weight");
  wrong = 0;
  for (size_t i = 0; i < mtp.eh_proj.size(); ++i) {
    wrong += mtp.eh_proj[i] != DummyValue(seed, eh, static_cast<int64_t>(i), 0.0f);
  }
  EXPECT_EQ(wrong, 0);
}

// Device dummy weights at TP (issue 31 item 1): each rank draws only its slice, element by
// element as the CUDA kernel does (DummyWeightPlan + DummySlice::GlobalIndex + DummyValue), and
// gets exactly the slice of the whole-tensor draw: the same seed is the same model at any TP.
TEST(TensorParallelTest, DummyShardsAreSlicesOfTheWholeDraw) {
  const uint64_t seed = 0x5eed0000 + std::random_device()() % 1000;
  SCOPED_TRACE(seed);
  for (auto [heads, kv] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}, {4, 4}}) {
    const ModelConfig c = Config(heads, kv);
    const ModelWeights full = RandomModelWeights(c, seed);
    for (int n : {1, 2, 4}) {
      for (int r = 0; r < n; ++r) {
        const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv) +
                                 " rank " + std::to_string(r) + " of " + std::to_string(n);
        auto plan = DummyWeightPlan(c, TpShard{r, n});
        ASSERT_TRUE(plan.ok()) << plan.status();
        auto sized = RandomModelWeights(c, seed, TpShard{r, n});
        ASSERT_TRUE(sized.ok()) << sized.status();
        ModelWeights drawn = *sized;
        ZeroAll(&drawn);
        for (const DummyTensorFill& f : *plan) {
          std::vector<float>* slot = SlotVector(&drawn, f.slot, f.layer);
          ASSERT_LE(f.offset + f.slice.numel(), static_cast<int64_t>(slot->size())) << what;
          for (int64_t i = 0; i < f.slice.numel(); ++i) {
            (*slot)[f.offset + i] = DummyValue(seed, f.stream_id, f.slice.GlobalIndex(i), f.mean);
          }
        }
        const ModelWeights expected = ExpectedShard(c, full, r, n);
        ExpectSameWeights(drawn, expected, what + " (per element)");
        ExpectSameWeights(*sized, expected, what + " (host)");
      }
    }
  }
  // Well scaled and seed-dependent: not a constant or a copy.
  const ModelConfig c = Config(8, 2);
  const ModelWeights a = RandomModelWeights(c, seed);
  double sum = 0.0, sum_sq = 0.0;
  for (float x : a.layers[0].qkv_proj) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double count = static_cast<double>(a.layers[0].qkv_proj.size());
  EXPECT_NEAR(sum / count, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sum_sq / count), 0.02, 0.002);
  EXPECT_NE(a.layers[0].qkv_proj, RandomModelWeights(c, seed + 1).layers[0].qkv_proj);
  EXPECT_NE(a.layers[0].qkv_proj, a.layers[1].qkv_proj);
}

// A pre-sharded checkpoint (WritePreShardedCheckpoint) loads, rank by rank, exactly what the
// original gives that rank (bf16: the parts are stored bit for bit), each rank's file holds
// about 1/N of the weights, and a group of another topology is refused by name.
TEST(TensorParallelTest, PreShardedCheckpointLoadsTheSameShards) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/tp_orig";
  const std::string out = ::testing::TempDir() + "/tp_pre";
  for (auto [heads, kv] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}}) {
    ModelConfig c = Config(heads, kv);
    c.dtype = WeightDtype::kBF16;
    ASSERT_TRUE(WriteDummyModel(c, dir, 5, /*shard_bytes=*/40000).ok());
    uint64_t whole = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") whole += fs::file_size(e.path());
    }
    for (auto [n, dcp] : {std::pair{2, 1}, {4, 1}, {4, 2}}) {
      const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv) +
                               " tp " + std::to_string(n) + " dcp " + std::to_string(dcp);
      const absl::Status written = WritePreShardedCheckpoint(dir, c, n, dcp, out);
      if (!ComputeTpDims(c, TpShard{0, n, dcp}).ok()) {  // e.g. 1 KV head over 2 KV shards
        EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument) << what;
        continue;
      }
      ASSERT_TRUE(written.ok()) << what << ": " << written;
      auto config = LoadModelConfig(out);  // config.json went along
      ASSERT_TRUE(config.ok()) << config.status();
      for (int r = 0; r < n; ++r) {
        auto expected = LoadModelWeights(dir, c, TpShard{r, n, dcp});
        ASSERT_TRUE(expected.ok()) << expected.status();
        auto loaded = LoadModelWeights(out, *config, TpShard{r, n, dcp});
        ASSERT_TRUE(loaded.ok()) << what << ": " << loaded.status();
        ExpectSameWeights(*loaded, *expected, what + " rank " + std::to_string(r));
        const uint64_t bytes = fs::file_size(
            fs::path(out) / ("rank-" + std::to_string(r) + "-of-" + std::to_string(n)) /
            "model.safetensors");
        // 1/N of the sharded part, plus norms (and KV heads replicated when kv < tp / dcp).
        EXPECT_LT(bytes, whole / n + whole / 4) << what << " rank " << r;
      }
      // Another group shape: refused, naming both.
      auto wrong = LoadModelWeights(out, *config, TpShard{0, n == 2 ? 4 : 2, 1});
      EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << what;
      EXPECT_NE(
          std::string(wrong.status().message()).find("pre-sharded for tp=" + std::to_string(n)),
          std::string::npos)
          << wrong.status();
      fs::remove_all(out);
    }
  }
  // A rank file gone: NOT_FOUND; the model directory as the output: refused.
  const ModelConfig c = Config(8, 2);
  ASSERT_TRUE(WriteDummyModel(c, dir, 5).ok());
  ASSERT_TRUE(WritePreShardedCheckpoint(dir, c, 2, 1, out).ok());
  fs::remove_all(fs::path(out) / "rank-1-of-2");
  EXPECT_EQ(LoadModelWeights(out, c, TpShard{1, 2}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(LoadModelWeights(out, c, TpShard{0, 2}).ok());
  EXPECT_EQ(WritePreShardedCheckpoint(dir, c, 2, 1, dir).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePreShardedCheckpoint(dir, c, 3, 1, out).code(),
            absl::StatusCode::kInvalidArgument);  // 8 heads over 3 ranks
  fs::remove_all(out);
  fs::remove_all(dir);
}

TEST(TensorParallelTest, LoadRejectsImpossibleTopology) {
  const std::string dir = ::testing::TempDir() + "/tp_bad";
  const ModelConfig c = Config(8, 2);
  ASSERT_TRUE(WriteDummyModel(c, dir, 3).ok());
  auto loaded = LoadModelWeights(dir, c, TpShard{0, 3});
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RandomModelWeights(c, 3, TpShard{0, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::runtime
