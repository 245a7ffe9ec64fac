// The CPU MLA decoder (mla_model.h): a whole prompt run as prefill (unabsorbed attention) gives
// the logits of the same tokens decoded one at a time (absorbed attention over the latent
// cache), on random weights; DCP without a group and CUDA refused.
#include "runtime/cpu/mla_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime {
namespace {

ModelConfig TinyMla() {
  auto c = ParseModelConfig(R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 80,
      "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 4, "first_k_dense_replace": 2,
      "q_lora_rank": 12, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
      "v_head_dim": 6, "max_position_embeddings": 256, "rope_parameters": {"rope_type": "yarn",
      "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
      "mscale": 1.0, "mscale_all_dim": 0.7}})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

struct PoolRun {
  std::vector<float> pool;
  kernels::KvCacheLayout layout;
};

// Runs tokens [begin, end) of `ids` as one step of one sequence whose first `begin` tokens are
// cached; logits of every new row.
std::vector<float> Step(MlaModel& model, PoolRun& run, const std::vector<int32_t>& ids,
                        int64_t begin, int64_t end) {
  std::vector<int64_t> positions, slots, rows;
  for (int64_t p = begin; p < end; ++p) {
    positions.push_back(p);
    slots.push_back(p);  // block table [0, 1, 2, ...]
    rows.push_back(p - begin);
  }
  std::vector<int32_t> table(run.layout.num_blocks);
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(end - begin)};
  const std::vector<int32_t> lens = {static_cast<int32_t>(end)};
  ForwardInput in;
  in.token_ids = absl::MakeConstSpan(ids.data() + begin, end - begin);
  in.positions = positions;
  in.slot_mapping = slots;
  in.attention.query_start_loc = qsl.data();
  in.attention.seq_lens = lens.data();
  in.attention.block_tables = table.data();
  in.attention.num_seqs = 1;
  in.attention.max_blocks_per_seq = static_cast<int64_t>(table.size());
  std::vector<float> logits;
  EXPECT_TRUE(model.Forward(in, {run.pool.data(), run.layout}, rows, &logits).ok());
  return logits;
}

TEST(MlaModelTest, AbsorbedDecodeEqualsUnabsorbedPrefillOfTheSameTokens) {
  const ModelConfig config = TinyMla();
  kernels::ThreadPool pool(2);
  auto model = MlaModel::Create(config, RandomModelWeights(config, 3), &pool);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_NE((*model)->softmax_scale(), 1.0f / std::sqrt(12.0f));  // YaRN's mscale^2
  EXPECT_NE((*model)->rope_attention_factor(), 1.0f);
  std::vector<int32_t> ids(21);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 80);
  PoolRun prefill{{}, (*model)->KvLayout(/*num_blocks=*/2, /*block_size=*/16)};
  prefill.pool.assign(prefill.layout.TotalElems(), 0.0f);
  PoolRun decode = prefill;
  const std::vector<float> all = Step(**model, prefill, ids, 0, 21);  // q_len 21: unabsorbed
  const int64_t V = config.vocab_size;
  ASSERT_EQ(all.size(), static_cast<size_t>(21 * V));
  float max_ref = 0, worst = 0;
  for (int64_t p = 0; p < 21; ++p) {
    const std::vector<float> one = Step(**model, decode, ids, p, p + 1);  // q_len 1: absorbed
    for (int64_t v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, std::fabs(all[p * V + v]));
      worst = std::max(worst, std::fabs(all[p * V + v] - one[v]));
    }
  }
  EXPECT_GT(max_ref, 0.0f);
  EXPECT_LE(worst, 1e-5f * max_ref) << "max |diff| " << worst << " of " << max_ref;
  // Both wrote the same latents.
  float latent_diff = 0;
  for (size_t i = 0; i < prefill.pool.size(); ++i) {
    latent_diff = std::max(latent_diff, std::fabs(prefill.pool[i] - decode.pool[i]));
  }
  EXPECT_LE(latent_diff, 1e-5f);
}

TEST(MlaModelTest, DcpNeedsAGroupAndRunsOverAnFp8LatentOnBothBackends) {
  const ModelConfig config = TinyMla();
  auto dcp = MlaModel::Create(config, RandomModelWeights(config, 1), nullptr, nullptr,
                              kernels::DcpShard{2, 0, 16});
  // DCP needs a group its shards divide (mla_tp_golden_test runs real ones).
  EXPECT_EQ(dcp.status().code(), absl::StatusCode::kInvalidArgument) << dcp.status();
  ModelConfig llama = config;
  llama.kv_lora_rank = 0;
  EXPECT_EQ(MlaModel::Create(llama, ModelWeights(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The CUDA backend runs MLA with DCP too (runtime/cuda/cuda_mla_model.h; tests/gpu/
  // dcp_cuda_golden.sh), over a 16-bit or an FP8 latent pool (tests/gpu/mla_fp8_cuda_golden.sh);
  // the CPU runs DCP over an FP8 latent (tests/golden/mla_fp8_kv_parallel_test.sh).
  for (const char* backend : {"cpu", "cuda"}) {
    for (const char* kv : {"auto", "fp8"}) {
      BackendOptions options;
      options.backend = backend;
      options.dcp_size = 2;
      options.kv_cache_dtype = kv;
      const absl::StatusOr<ExecutorFactory> f = MakeExecutorFactory(options, config);
      if (std::string(backend) == "cpu" || CudaBackendAvailable()) {
        ASSERT_TRUE(f.ok()) << backend << " " << kv << ": " << f.status();
        EXPECT_EQ(f->dcp_size, 2);
      } else {
        EXPECT_EQ(f.status().code(), absl::StatusCode::kUnimplemented) << f.status();
      }
    }
  }
}

}  // namespace
}  // namespace tandem::runtime
