// The OpenAI-compatible HTTP API on a real router with fake workers (real gRPC), over raw
// HTTP/1.1 on loopback, with the real Qwen2.5 tokenizer and chat template (tokenizer/ fixtures):
// completions and chat (whole and streamed: the SSE deltas concatenate to the whole text, which
// is the tokenizer's decoding of what the worker generated), usage, n, stop strings cutting the
// text and aborting the request on the worker, /v1/models, /tokenize + /detokenize, a client that
// disconnects mid-stream aborting its request, and the error codes (400 naming the field, 404,
// 405, 503 without workers) with nothing sent to a worker for a bad request; API keys; the
// same API over HTTPS; and a model directory with only a SentencePiece tokenizer.model, served
// by this gRPC/libprotobuf binary through libtandem_spm.so in its own link namespace.
#include "router/openai/http_api.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/test_client.h"
#include "common/security/test_certs.h"
#include "gtest/gtest.h"
#include "router/testing/router_test_util.h"
#include "tokenizer/sentencepiece_library.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

using HttpResult = http::TestResponse;

HttpResult Call(int port, const std::string& method, const std::string& path,
                const std::string& body = "") {
  return http::HttpCall(port, method, path, body);
}

// The SSE events' JSON payloads (the "[DONE]" marker as a string).
std::vector<Json> Events(const std::string& body) {
  std::vector<Json> out;
  for (absl::string_view part : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&part, "data: ")) continue;
    out.push_back(part == "[DONE]" ? Json("[DONE]") : Json::parse(std::string(part)));
  }
  return out;
}

// A model directory: the Qwen2.5 tokenizer and chat template (fixtures), a config.json.
std::string ModelDir() {
  const std::string dir = ::testing::TempDir() + "/qwen-api";
  std::filesystem::create_directories(dir);
  const std::filesystem::path root = std::filesystem::current_path();
  std::filesystem::copy_file(root / "tokenizer/testdata/qwen2/tokenizer.json",
                             dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(root / "tokenizer/chat/testdata/configs/qwen2.5_tokenizer_config.json",
                             dir + "/tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/config.json") << R"({"max_position_embeddings": 4096})";
  return dir;
}

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = ServedModel::Load(ModelDir(), "qwen-test");
    ASSERT_TRUE(model.ok()) << model.status();
    vocab_ = static_cast<uint32_t>((*model)->tokenizer->vocab_size());
    HttpApiOptions options;
    options.max_running = 4;
    auto api = HttpApi::Start(options, *std::move(model), &harness_.server().registry(),
                              &harness_.server().requests(), &harness_.server().orchestrator());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }
  FakeWorker* AddWorker(absl::Duration token_delay = absl::ZeroDuration()) {
    return harness_.AddWorker("w", v1::WORKER_ROLE_MIXED, [&](FakeWorkerOptions& o) {
      o.vocab_size = vocab_;
      o.token_delay = token_delay;
    });
  }
  // What the fake worker generates for `prompt`, as text.
  std::string Expected(const std::vector<uint32_t>& prompt, uint32_t max_tokens) {
    v1::GenerateRequest r = MakeRequest(prompt, max_tokens);
    const FakeCompletion c = FakeGenerate(r, vocab_, {});
    std::vector<int32_t> ids(c.tokens.begin(), c.tokens.end());
    return *api_->model().tokenizer->Decode(ids, /*skip_special_tokens=*/true);
  }
  std::vector<uint32_t> Tokens(const std::string& text) {
    auto ids = api_->model().tokenizer->Encode(text, true);
    return std::vector<uint32_t>(ids->begin(), ids->end());
  }

  RouterHarness harness_;
  std::unique_ptr<HttpApi> api_;
  uint32_t vocab_ = 0;
};

TEST_F(HttpApiTest, CompletionsWholeAndStreamedAgree) {
  FakeWorker* w = AddWorker();
  const std::string prompt = "Hello, 世界! The quick brown fox";
  const std::string want = Expected(Tokens(prompt), 12);
  Json req = {{"model", "qwen-test"}, {"prompt", prompt}, {"max_tokens", 12}};
  HttpResult whole = Call(api_->port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = Json::parse(whole.body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], want);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_EQ(body["usage"]["prompt_tokens"], Tokens(prompt).size());
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  HttpResult streamed = Call(api_->port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(streamed.status, 200);
  std::string text;
  const std::vector<Json> events = Events(streamed.body);
  ASSERT_GE(events.size(), 3u);
  for (const Json& e : events) {
    if (e.is_string() || e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, want);
  EXPECT_EQ(events.back(), Json("[DONE]"));
  EXPECT_EQ(events[events.size() - 2]["usage"]["completion_tokens"], 12);
  EXPECT_EQ(w->counters().generate, 2);
}

TEST_F(HttpApiTest, ChatRendersTheTemplateStreamsDeltasAndHonoursN) {
  AddWorker();
  Json req = {
      {"model", "qwen-test"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi 👋"}}}},
      {"max_tokens", 8},
      {"n", 2}};
  const std::string rendered =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n"
      "<|im_start|>assistant\n";
  HttpResult tok =
      Call(api_->port(), "POST", "/tokenize", Json{{"messages", req["messages"]}}.dump());
  ASSERT_EQ(tok.status, 200) << tok.body;
  std::vector<uint32_t> ids = Json::parse(tok.body)["tokens"].get<std::vector<uint32_t>>();
  auto direct = api_->model().tokenizer->Encode(rendered, false);
  EXPECT_EQ(ids, std::vector<uint32_t>(direct->begin(), direct->end()))
      << "the chat template's prompt";
  HttpResult whole = Call(api_->port(), "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = Json::parse(whole.body);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], Expected(ids, 8));
  req["stream"] = true;  // both choices at once, their chunks interleaved, told apart by index
  const std::vector<Json> events =
      Events(Call(api_->port(), "POST", "/v1/chat/completions", req.dump()).body);
  std::string content[2];
  bool role[2] = {false, false};
  for (const Json& e : events) {
    if (e.is_string()) continue;
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    const int index = e["choices"][0]["index"].get<int>();
    ASSERT_TRUE(index == 0 || index == 1);
    const Json& delta = e["choices"][0]["delta"];
    if (delta.contains("role")) role[index] = true;
    if (delta.contains("content")) content[index] += delta["content"].get<std::string>();
  }
  EXPECT_TRUE(role[0] && role[1]);
  EXPECT_EQ(content[0], Expected(ids, 8));
  EXPECT_EQ(content[1], Expected(ids, 8));
}

TEST_F(HttpApiTest, StopStringsCutTheTextAndAbortTheRequest) {
  FakeWorker* w = AddWorker(absl::Milliseconds(5));
  const std::string prompt = "Count with me";
  const std::string full = Expected(Tokens(prompt), 40);
  // A stop string from the middle of what the worker would produce.
  std::string stop;
  size_t cut = std::string::npos;
  for (size_t at = full.size() / 3; at + 3 < full.size() && stop.empty(); ++at) {
    if ((static_cast<unsigned char>(full[at]) & 0xC0) == 0x80) continue;
    stop = full.substr(at, 3);
    if ((static_cast<unsigned char>(stop.back()) & 0x80) != 0) stop.clear();  // ASCII end only
    cut = full.find(stop);
  }
  ASSERT_FALSE(stop.empty()) << full;
  Json req = {{"model", "qwen-test"}, {"prompt", prompt}, {"max_tokens", 40}, {"stop", stop}};
  HttpResult r = Call(api_->port(), "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const Json body = Json::parse(r.body);
  EXPECT_EQ(body["choices"][0]["text"], full.substr(0, cut));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(body["usage"]["completion_tokens"].get<int>(), 40);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w->counters().abort == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(w->counters().abort, 1) << "the request was ended on the worker";
}

TEST_F(HttpApiTest, ModelsTokenizeDetokenizeAndErrors) {
  // No worker yet: 503, nothing routed.
  Json req = {{"model", "qwen-test"}, {"prompt", "hi"}};
  EXPECT_EQ(Call(api_->port(), "POST", "/v1/completions", req.dump()).status, 503);
  EXPECT_EQ(Call(api_->port(), "GET", "/health").status, 503);
  FakeWorker* w = AddWorker();
  EXPECT_EQ(Call(api_->port(), "GET", "/health").status, 200);
  const Json models = Json::parse(Call(api_->port(), "GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "qwen-test");
  EXPECT_EQ(models["data"][0]["max_model_len"], 4096);
  HttpResult tok = Call(api_->port(), "POST", "/tokenize",
                        Json{{"prompt", "naïve café 😀"}, {"add_special_tokens", false}}.dump());
  const Json t = Json::parse(tok.body);
  EXPECT_EQ(t["count"], t["tokens"].size());
  HttpResult detok =
      Call(api_->port(), "POST", "/detokenize", Json{{"tokens", t["tokens"]}}.dump());
  EXPECT_EQ(Json::parse(detok.body)["prompt"], "naïve café 😀");
  struct Bad {
    std::string body;
    int status;
    std::string names;
  };
  const std::vector<Bad> bad = {
      {"{not json", 400, "not valid JSON"},
      {R"({"prompt": "x"})", 400, "'model'"},
      {R"({"model": "other", "prompt": "x"})", 404, "other"},
      {R"({"model": "qwen-test", "prompt": "x", "temperature": "hot"})", 400, "'temperature'"},
      {R"({"model": "qwen-test", "prompt": "x", "max_tokens": 0})", 400, "'max_tokens'"},
      {R"({"model": "qwen-test", "prompt": "x", "n": 99})", 400, "'n'"},
      {R"({"model": "qwen-test", "prompt": [99999999]})", 400, "'prompt'"},
      {R"({"model": "qwen-test", "prompt": "x", "logprobs": 2})", 400, "'logprobs'"},
      {R"({"model": "qwen-test", "prompt": "x", "stop": 5})", 400, "'stop'"},
      {R"({"model": "qwen-test", "prompt": "x", "max_tokens": 5000})", 400, "context"},
  };
  const int calls = w->total_calls();
  for (const Bad& b : bad) {
    HttpResult r = Call(api_->port(), "POST", "/v1/completions", b.body);
    EXPECT_EQ(r.status, b.status) << b.body << " -> " << r.body;
    EXPECT_NE(r.body.find(b.names), std::string::npos) << b.body << " -> " << r.body;
    EXPECT_NE(r.body.find("\"error\""), std::string::npos);
  }
  HttpResult chat_bad = Call(api_->port(), "POST", "/v1/chat/completions",
                             R"({"model": "qwen-test", "messages": [{"content": "x"}]})");
  EXPECT_EQ(chat_bad.status, 400);
  EXPECT_NE(chat_bad.body.find("'messages'"), std::string::npos);
  EXPECT_EQ(Call(api_->port(), "GET", "/v1/completions").status, 405);
  EXPECT_EQ(w->total_calls(), calls) << "no bad request reached a worker";
}

TEST_F(HttpApiTest, AClientLeavingMidStreamAbortsItsRequest) {
  FakeWorker* w = AddWorker(absl::Milliseconds(50));
  const int fd = http::ConnectLoopback(api_->port());
  ASSERT_GE(fd, 0);
  const std::string body = Json{
      {"model", "qwen-test"},
      {"prompt", "a long story"},
      {"max_tokens", 500},
      {"stream", true}}.dump();
  const std::string req =
      absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: ", body.size(),
                   "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  char buf[4096];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);  // the stream started
  close(fd);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((w->counters().abort == 0 || w->open_streams() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(w->counters().abort, 1);
  EXPECT_EQ(w->open_streams(), 0);
}

// The same for a whole (not streamed) answer: the client that leaves before it cancels its
// requests on the workers. Before (H4's probe), such a request generated all its max_tokens for
// nobody: 16 requests closed after 50 ms kept a decode worker busy for minutes.
TEST_F(HttpApiTest, AClientLeavingBeforeAWholeAnswerAbortsItsRequest) {
  FakeWorker* w = AddWorker(absl::Milliseconds(50));
  const int fd = http::ConnectLoopback(api_->port());
  ASSERT_GE(fd, 0);
  const std::string body =
      Json{{"model", "qwen-test"}, {"prompt", "a long story"}, {"max_tokens", 500}}.dump();
  const std::string req =
      absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: ", body.size(),
                   "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w->open_streams() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(w->open_streams(), 1) << "the request is generating";
  close(fd);
  deadline = absl::Now() + absl::Seconds(10);
  while ((w->counters().abort == 0 || w->open_streams() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(w->counters().abort, 1);
  EXPECT_EQ(w->open_streams(), 0);
  // A client that stays gets its whole answer.
  HttpResult whole = Call(api_->port(), "POST", "/v1/completions",
                          Json{{"model", "qwen-test"}, {"prompt", "hi"}, {"max_tokens", 3}}.dump());
  EXPECT_EQ(whole.status, 200) << whole.body;
}

TEST(HttpApiKeysTest, EveryRouteButHealthNeedsAKey) {
  RouterHarness harness;
  auto model = ServedModel::Load(ModelDir(), "qwen-test");
  ASSERT_TRUE(model.ok()) << model.status();
  HttpApiOptions options;
  absl::StatusOr<security::ApiKeySet> keys =
      security::ApiKeySet::Parse("sk-http-0123456789abcdef alice\n");
  ASSERT_TRUE(keys.ok());
  options.api_keys = *keys;
  auto api = HttpApi::Start(options, *std::move(model), &harness.server().registry(),
                            &harness.server().requests(), &harness.server().orchestrator());
  ASSERT_TRUE(api.ok()) << api.status();
  const int port = (*api)->port();
  const std::string bad_body = "{not json";
  for (const std::vector<std::string>& headers :
       {std::vector<std::string>{},
        {"Authorization: Bearer sk-http-0123456789abcdeX"},
        {"Authorization: Basic sk-http-0123456789abcdef"}}) {
    for (const auto& [method, path] :
         std::vector<std::pair<std::string, std::string>>{{"GET", "/v1/models"},
                                                          {"POST", "/v1/completions"},
                                                          {"POST", "/v1/chat/completions"},
                                                          {"POST", "/tokenize"}}) {
      // The key is checked before the (malformed) body is looked at.
      http::TestResponse r = http::HttpCall(port, method, path, bad_body, headers);
      ASSERT_EQ(r.status, 401) << path << " " << r.body;
      const Json body = Json::parse(r.body);
      EXPECT_EQ(body["error"]["type"], "authentication_error");
      EXPECT_EQ(body["error"]["code"], 401);
      EXPECT_EQ(body["error"]["message"], "invalid or missing API key");
    }
  }
  http::TestResponse ok = http::HttpCall(port, "GET", "/v1/models", "",
                                         {"Authorization: Bearer sk-http-0123456789abcdef"});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Json::parse(ok.body)["data"][0]["id"], "qwen-test");
  http::TestResponse bad = http::HttpCall(port, "POST", "/v1/completions", bad_body,
                                          {"authorization: bearer sk-http-0123456789abcdef"});
  EXPECT_EQ(bad.status, 400) << bad.body;  // authenticated: now the body is judged
  EXPECT_NE(http::HttpCall(port, "GET", "/health").status, 401);  // probes need no key
}

// HTTPS (the router's default): the same API and stream over TLS, the key still required, and a
// plain HTTP client told to use https://.
TEST(HttpApiTlsTest, ServesHttpsWithKeysAndStreams) {
  absl::StatusOr<security::TestCerts> certs = security::MakeTestCerts("http-api");
  ASSERT_TRUE(certs.ok()) << certs.status();
  const security::SecurityConfig router = certs->Config("router");
  RouterHarness harness;
  auto model = ServedModel::Load(ModelDir(), "qwen-test");
  ASSERT_TRUE(model.ok()) << model.status();
  const uint32_t vocab = static_cast<uint32_t>((*model)->tokenizer->vocab_size());
  harness.AddWorker("w", v1::WORKER_ROLE_MIXED,
                    [&](FakeWorkerOptions& o) { o.vocab_size = vocab; });
  HttpApiOptions options;
  options.api_keys = *security::ApiKeySet::Parse("sk-tls-0123456789abcdef bob\n");
  options.tls = http::ServerTlsOptions{router.tls.cert_pem, router.tls.key_pem, ""};
  auto api = HttpApi::Start(options, *std::move(model), &harness.server().registry(),
                            &harness.server().requests(), &harness.server().orchestrator());
  ASSERT_TRUE(api.ok()) << api.status();
  const int port = (*api)->port();
  const http::ClientTlsOptions tls{router.tls.ca_pem, "", "", ""};
  const std::vector<std::string> key = {"Authorization: Bearer sk-tls-0123456789abcdef"};
  const std::string body =
      Json{{"model", "qwen-test"}, {"prompt", "Hello"}, {"max_tokens", 6}}.dump();
  http::TestResponse whole = http::HttpsCall(port, tls, "POST", "/v1/completions", body, key);
  ASSERT_EQ(whole.status, 200) << whole.body;
  Json streamed_body = Json::parse(body);
  streamed_body["stream"] = true;
  http::TestResponse streamed =
      http::HttpsCall(port, tls, "POST", "/v1/completions", streamed_body.dump(), key);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string text;
  const std::vector<Json> events = Events(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  for (const Json& e : events) {
    if (e.is_object() && !e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, Json::parse(whole.body)["choices"][0]["text"]);
  EXPECT_EQ(http::HttpsCall(port, tls, "GET", "/v1/models").status, 401);
  http::TestResponse plain = http::HttpCall(port, "GET", "/v1/models", "", key);
  EXPECT_EQ(plain.status, 400);
  EXPECT_NE(plain.body.find("https://"), std::string::npos) << plain.body;
}

// Mistral's tokenizer.model (fixture) and a config.json, nothing else: no tokenizer.json.
std::string SentencePieceModelDir() {
  const std::string dir = ::testing::TempDir() + "/mistral-spm";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(
      std::filesystem::current_path() / "tokenizer/testdata/mistral_v3/tokenizer.model",
      dir + "/tokenizer.model", std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/config.json") << R"({"max_position_embeddings": 4096})";
  return dir;
}

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

// SentencePiece's own decoding (the library, in its namespace), the reference for the text.
std::string SentencePieceDecode(const std::string& model_path, const std::vector<int32_t>& ids) {
  absl::StatusOr<const tokenizer::SentencePieceLibrary*> lib =
      tokenizer::SentencePieceLibrary::Default();
  if (!lib.ok()) return lib.status().ToString();
  char* error = nullptr;
  tandem_spm_model* model = (*lib)->load(model_path.c_str(), &error);
  if (model == nullptr) return (*lib)->TakeError(error);
  char* text = nullptr;
  size_t len = 0;
  std::string out = (*lib)->decode(model, ids.data(), ids.size(), &text, &len, &error) == 0
                        ? std::string(text, len)
                        : (*lib)->TakeError(error);
  if (text != nullptr) (*lib)->free(text);
  (*lib)->unload(model);
  return out;
}

TEST(HttpApiSentencePieceTest, ServesATokenizerModelOnlyDirectory) {
  const std::string dir = SentencePieceModelDir();
  RouterHarness harness;
  auto model = ServedModel::Load(dir, "mistral-test");
  ASSERT_TRUE(model.ok()) << model.status();
  const uint32_t vocab = static_cast<uint32_t>((*model)->tokenizer->vocab_size());
  EXPECT_EQ(vocab, 32768u);
  FakeWorker* w = harness.AddWorker("w", v1::WORKER_ROLE_MIXED,
                                    [&](FakeWorkerOptions& o) { o.vocab_size = vocab; });
  auto api = HttpApi::Start(HttpApiOptions(), *std::move(model), &harness.server().registry(),
                            &harness.server().requests(), &harness.server().orchestrator());
  ASSERT_TRUE(api.ok()) << api.status();
  const int port = (*api)->port();
  // SentencePiece's (Python package's) ids and text for corpus texts, through the HTTP API.
  const Json expected = ReadJson("tokenizer/testdata/mistral_v3/expected.json");
  for (int i : {0, 2, 8, 15, 18}) {
    const Json& c = expected["cases"][i];
    HttpResult tok = Call(port, "POST", "/tokenize", Json{{"prompt", c["text"]}}.dump());
    ASSERT_EQ(tok.status, 200) << tok.body;
    EXPECT_EQ(Json::parse(tok.body)["tokens"], c["ids_with_special"]) << c["text"];
    HttpResult detok = Call(port, "POST", "/detokenize", Json{{"tokens", c["ids"]}}.dump());
    ASSERT_EQ(detok.status, 200) << detok.body;
    EXPECT_EQ(Json::parse(detok.body)["prompt"], c["decoded_skip_special"]);
  }
  // A completion, whole and streamed: the text of the fake worker's tokens, as SentencePiece
  // itself decodes them.
  const std::string prompt = "Bonjour, 世界! Tell me a story";
  const std::vector<int32_t> prompt_ids = *(*api)->model().tokenizer->Encode(prompt, true);
  const FakeCompletion fake = FakeGenerate(
      MakeRequest(std::vector<uint32_t>(prompt_ids.begin(), prompt_ids.end()), 16), vocab, {});
  const std::string want = SentencePieceDecode(
      dir + "/tokenizer.model", std::vector<int32_t>(fake.tokens.begin(), fake.tokens.end()));
  ASSERT_FALSE(want.empty());
  Json req = {{"model", "mistral-test"}, {"prompt", prompt}, {"max_tokens", 16}};
  HttpResult whole = Call(port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(Json::parse(whole.body)["choices"][0]["text"], want);
  EXPECT_EQ(Json::parse(whole.body)["usage"]["prompt_tokens"], prompt_ids.size());
  req["stream"] = true;
  HttpResult streamed = Call(port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string text;
  for (const Json& e : Events(streamed.body)) {
    if (e.is_object() && !e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, want);
  EXPECT_EQ(w->counters().generate, 2);
  // No chat template in the directory: chat is refused, naming the way out.
  HttpResult chat =
      Call(port, "POST", "/v1/chat/completions",
           R"({"model": "mistral-test", "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(chat.status, 400);
  EXPECT_NE(chat.body.find("/v1/completions"), std::string::npos) << chat.body;
}

}  // namespace
}  // namespace tandem::router::openai
