// A checkpoint read straight into device memory (checkpoint_upload.h, LoadModelForBackend's
// default on CUDA) against the same checkpoint through fp32 host weights (LoadModelWeights +
// CudaLlamaModel::Upload): the same device weights, so bit-identical prompt logits and the same
// greedy tokens, for a bf16 checkpoint and an f32 one (rounded on the host vs on the device). GPU;
// skips without one. The host side (slicing, TP ranks, conversions) is weight_stream_test's.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  std::vector<std::vector<float>> logits;  // each prompt's last-position logits
  std::vector<std::vector<int32_t>> tokens;
};

Outcome Generate(const ModelConfig& model, ModelWeights weights, const ExecutorFactory& factory) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_batched_tokens = 512;
  auto engine = Engine::Create(config, model, std::move(weights), {}, &factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  Outcome out;
  if (!engine.ok()) return out;
  const int n = 3;
  out.logits.resize(n);
  out.tokens.resize(n);
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    for (int t = 0; t < 20 + 7 * i; ++t) spec.prompt.push_back(3 + (t * 37 + i * 11) % 1000);
    spec.max_tokens = 12;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE((*engine)->AddRequest(i, spec).ok());
  }
  while ((*engine)->HasUnfinished()) {
    auto updates = (*engine)->Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      auto& t = out.tokens[u.request_id];
      t.insert(t.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (!u.last_prompt_logits.empty()) out.logits[u.request_id] = std::move(u.last_prompt_logits);
    }
  }
  return out;
}

class CheckpointUploadTest : public ::testing::TestWithParam<WeightDtype> {};

TEST_P(CheckpointUploadTest, DeviceReadEqualsTheFp32HostPath) {
  // The checkpoint and both loads run without a GPU too (CI checks this set-up); the engines
  // need one.
  ModelConfig model = engine_test::MidConfig();
  model.architecture = "Qwen2ForCausalLM";  // fused q / k / v biases too
  model.qkv_bias = true;
  model.dtype = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("upload_", ::getpid(), "_", WeightDtypeName(model.dtype));
  // Small shards: q / k / v and gate / up of a layer in different files.
  const absl::Status written = WriteDummyModel(model, dir.string(), /*seed=*/21, 1 << 20);
  ASSERT_TRUE(written.ok()) << written;
  absl::StatusOr<ModelConfig> loaded_config = LoadModelConfig(dir.string());
  ASSERT_TRUE(loaded_config.ok()) << loaded_config.status();
  // The old path: fp32 host weights, converted on the device.
  absl::StatusOr<ModelWeights> host = LoadModelWeights(dir.string(), *loaded_config);
  ASSERT_TRUE(host.ok()) << host.status();
  // The binaries' path: LoadModelForBackend hands the host no weights, the runner reads them.
  ModelSource source;
  source.model_dir = dir.string();
  BackendOptions backend;
  backend.backend = "cuda";
  backend.dtype = "bf16";
  absl::StatusOr<BackendModel> device = LoadModelForBackend(source, backend);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_TRUE(device->model.weights.layers.empty());
  EXPECT_TRUE(device->model.weights.embed_tokens.empty());
  TANDEM_SKIP_WITHOUT_GPU();

  CudaBackendConfig host_backend;
  host_backend.gemm_autotune = false;
  const Outcome want =
      Generate(*loaded_config, std::move(*host), CudaExecutorFactory(host_backend));
  const Outcome got =
      Generate(device->model.local_config, std::move(device->model.weights), device->factory);

  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < want.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i].size(), static_cast<size_t>(model.vocab_size)) << i;
    ASSERT_EQ(want.logits[i].size(), got.logits[i].size()) << i;
    EXPECT_EQ(std::memcmp(got.logits[i].data(), want.logits[i].data(),
                          want.logits[i].size() * sizeof(float)),
              0)
        << "prompt " << i << ": logits differ";
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "prompt " << i;
    EXPECT_EQ(want.tokens[i].size(), 12u);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(StoredDtypes, CheckpointUploadTest,
                         ::testing::Values(WeightDtype::kBF16, WeightDtype::kF32),
                         [](const auto& info) { return std::string(WeightDtypeName(info.param)); });

}  // namespace
}  // namespace tandem::runtime::cuda
