// A model whose embedding is larger than its tokenizer (issue 30 item 6): the quickstart's text
// model (deploy/local/make_text_model.sh: Qwen2-shaped, 151,936 embedding rows, the Qwen2.5
// tokenizer with 151,665 ids), written as a real checkpoint whose 271 padding rows are scaled up
// so their logits dominate every step (a random model puts ~0.18% of its mass there, which is how
// 5 of 6 800-token chats died). One process: an in-process router with the HTTP API and a real
// CPU worker (WorkerDaemon) serving the checkpoint.
//
//   * without vocab_limit the model does sample padding ids (the weights do what they should);
//   * with it, at temperatures 1 and 2 and any seed, no id >= 151,665 is ever produced (gRPC);
//   * the HTTP API (which sets vocab_limit from its tokenizer) serves whole and streamed
//     completions at temperature 2 without an error, every token decodable.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/test_client.h"
#include "gtest/gtest.h"
#include "router/openai/http_api.h"
#include "router/testing/router_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/worker/worker_daemon.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

constexpr int64_t kTokenizerIds = 151665;  // the Qwen2.5 tokenizer (checked below)
constexpr int64_t kEmbeddingRows = 151936;

// make_text_model.sh's directory with a checkpoint (WriteDummyModel) whose padding rows of the
// tied embedding are redrawn 200x larger: their logits then exceed every real token's by ~50x
// the real logits' spread.
std::string WritePaddedModel() {
  const std::string dir = ::testing::TempDir() + "/padded-text-model";
  const std::string script = (std::filesystem::current_path() / "deploy/local/make_text_model.sh");
  EXPECT_EQ(std::system(absl::StrCat(script, " ", dir, " > /dev/null").c_str()), 0);
  absl::StatusOr<runtime::ModelConfig> config = runtime::LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab_size, kEmbeddingRows);
  EXPECT_TRUE(runtime::WriteDummyModel(*config, dir, /*seed=*/30).ok());
  const std::string path = dir + "/model.safetensors";
  absl::StatusOr<std::unique_ptr<runtime::SafetensorsFile>> file =
      runtime::SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<float>> values;
  std::vector<runtime::TensorToWrite> tensors;
  for (const runtime::TensorInfo& t : (*file)->tensors()) {
    EXPECT_EQ(t.dtype, runtime::SafetensorsDtype::kF32) << t.name;
    values.emplace_back(static_cast<size_t>(t.nbytes / 4));
    std::memcpy(values.back().data(), t.data, static_cast<size_t>(t.nbytes));
    if (t.name == "model.embed_tokens.weight") {
      const int64_t hidden = t.shape[1];
      for (int64_t i = kTokenizerIds * hidden; i < kEmbeddingRows * hidden; ++i) {
        values.back()[i] *= 200.0f;
      }
    }
  }
  size_t i = 0;
  for (const runtime::TensorInfo& t : (*file)->tensors()) {
    tensors.push_back({t.name, runtime::SafetensorsDtype::kF32, t.shape, values[i++].data()});
  }
  EXPECT_TRUE(runtime::WriteSafetensors(path, tensors).ok());
  return dir;
}

class VocabPaddingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_dir_ = new std::string(WritePaddedModel()); }
  static void TearDownTestSuite() { delete model_dir_; }

  void SetUp() override {
    runtime::WorkerConfig config;
    config.role = v1::WORKER_ROLE_MIXED;
    config.model.model_dir = *model_dir_;
    config.backend.num_threads = 1;
    config.engine.num_threads = 1;
    config.engine.kv_cache_bytes = int64_t{16} << 20;
    config.worker_id = "padded";
    config.router = harness_.address();
    absl::StatusOr<std::unique_ptr<runtime::WorkerDaemon>> worker =
        runtime::WorkerDaemon::Create(config);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    ASSERT_TRUE(harness_.WaitForHealth("padded", true));
    auto model = router::openai::ServedModel::Load(*model_dir_, "text");
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->tokenizer->vocab_size(), kTokenizerIds);
    auto api = router::openai::HttpApi::Start(
        router::openai::HttpApiOptions(), *std::move(model), &harness_.server().registry(),
        &harness_.server().requests(), &harness_.server().orchestrator());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }

  // Tokens of a whole gRPC Generate (1 + max_tokens - 1 of them, eos ignored).
  std::vector<uint32_t> Generate(float temperature, uint64_t seed, uint32_t vocab_limit) {
    v1::GenerateRequest r = router::MakeRequest({9707, 11, 1879, 0}, 24);  // "Hello, world!"
    r.mutable_sampling()->set_temperature(temperature);
    r.mutable_sampling()->set_seed(seed);
    r.mutable_sampling()->set_ignore_eos(true);
    r.mutable_sampling()->set_vocab_limit(vocab_limit);
    const router::StreamResult s = harness_.Generate(r);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens.size(), 24u);
    return s.tokens;
  }

  static std::string* model_dir_;
  router::RouterHarness harness_;
  std::unique_ptr<runtime::WorkerDaemon> worker_;
  std::unique_ptr<router::openai::HttpApi> api_;
};
std::string* VocabPaddingTest::model_dir_ = nullptr;

TEST_F(VocabPaddingTest, NoIdPastTheTokenizerIsEverSampled) {
  const uint64_t seed = router::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // The whole vocabulary: the padding rows win (what an unmasked sampler hands the router).
  int padding = 0;
  for (uint32_t t : Generate(1.0f, seed, 0)) padding += t >= kTokenizerIds;
  EXPECT_GT(padding, 12) << "the padding rows should dominate without a limit";
  // Limited to the tokenizer: never, greedy and sampled, at any seed.
  for (float temperature : {0.0f, 1.0f, 2.0f}) {
    for (uint64_t s = seed; s < seed + 4; ++s) {
      for (uint32_t t : Generate(temperature, s, kTokenizerIds)) {
        ASSERT_LT(t, kTokenizerIds) << "T=" << temperature << " seed " << s;
      }
    }
  }
}

TEST_F(VocabPaddingTest, HttpCompletionsAtHighTemperatureAllDecode) {
  const uint64_t seed = router::FreshSeed() >> 1;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Json req = {
      {"model", "text"}, {"prompt", "Hello, world!"}, {"max_tokens", 24}, {"temperature", 2.0},
      {"n", 4},          {"ignore_eos", true},        {"seed", seed}};
  const http::TestResponse whole =
      http::HttpCall(api_->port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = Json::parse(whole.body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4 * 24);
  ASSERT_EQ(body["choices"].size(), 4u);
  Json streamed = req;
  streamed["stream"] = true;
  streamed["messages"] = Json::array({{{"role", "user"}, {"content", "Hello, world!"}}});
  streamed.erase("prompt");
  const http::TestResponse sse =
      http::HttpCall(api_->port(), "POST", "/v1/chat/completions", streamed.dump());
  ASSERT_EQ(sse.status, 200) << sse.body;
  int chunks = 0;
  for (absl::string_view part : absl::StrSplit(sse.body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::ConsumePrefix(&part, "data: ")) << part;
    if (part == "[DONE]") continue;
    const Json event = Json::parse(std::string(part));
    ASSERT_FALSE(event.contains("error")) << part;
    ++chunks;
  }
  EXPECT_GE(chunks, 4);
}

}  // namespace
}  // namespace tandem
