// The HTTP API's field bounds and its ids (issue 30, items 6-8), on a real router with fake workers
// over loopback and the real Qwen2.5 tokenizer (151,665 ids; the model's embedding has 151,936):
//   * every bounded field (n, best_of, logprobs, stop, stop_token_ids, user, logit_bias, tools,
//     messages: count and size) is a 400 naming it, nothing reaching a worker; the edges serve;
//   * ids never wrap: 2^32 is not stop id 0, /detokenize of 2^63 or 2^32 + 100 is a 400;
//   * a worker that returns an id the tokenizer cannot decode (one that ignores vocab_limit) is
//     the server's fault: 500 `server_error`, whole or streamed, never the client's 400.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/test_client.h"
#include "gtest/gtest.h"
#include "router/openai/http_api.h"
#include "router/testing/router_test_util.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

constexpr uint32_t kQwenEmbeddingRows = 151936;

http::TestResponse Post(int port, const std::string& path, const Json& body) {
  return http::HttpCall(port, "POST", path, body.dump());
}

std::string ModelDir() {
  const std::string dir = ::testing::TempDir() + "/qwen-fields";
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

class HttpFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = ServedModel::Load(ModelDir(), "qwen-test");
    ASSERT_TRUE(model.ok()) << model.status();
    vocab_ = static_cast<uint32_t>((*model)->tokenizer->vocab_size());
    ASSERT_LT(vocab_, kQwenEmbeddingRows);
    auto api = HttpApi::Start(HttpApiOptions(), *std::move(model), &harness_.server().registry(),
                              &harness_.server().requests(), &harness_.server().orchestrator());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }
  // A worker with the model's vocabulary: the embedding's 151,936 rows. The fake generates
  // (31 * prev + 7) % rows, or % vocab_limit when smaller, unless it ignores the limit.
  FakeWorker* AddWorker(bool ignore_vocab_limit = false) {
    return harness_.AddWorker("w", v1::WORKER_ROLE_MIXED, [&](FakeWorkerOptions& o) {
      o.vocab_size = kQwenEmbeddingRows;
      o.ignore_vocab_limit = ignore_vocab_limit;
    });
  }
  int port() const { return api_->port(); }

  RouterHarness harness_;
  std::unique_ptr<HttpApi> api_;
  uint32_t vocab_ = 0;
};

struct Bad {
  Json body;
  std::string names;
};

void ExpectRefused(int port, const std::string& path, const Bad& b) {
  const http::TestResponse r = Post(port, path, b.body);
  const std::string shown = b.body.dump().substr(0, 200);
  EXPECT_EQ(r.status, 400) << shown << " -> " << r.body;
  EXPECT_NE(r.body.find(b.names), std::string::npos) << shown << " -> " << r.body;
  EXPECT_NE(r.body.find("invalid_request_error"), std::string::npos) << r.body;
}

TEST_F(HttpFieldsTest, EveryFieldIsBoundedWithA400NamingIt) {
  FakeWorker* w = AddWorker();
  const Json base = {{"model", "qwen-test"}, {"prompt", "hi"}, {"max_tokens", 2}};
  const auto with = [&](const char* key, Json value) {
    Json b = base;
    b[key] = std::move(value);
    return b;
  };
  Json stop_ids_65 = Json::array(), stop_ids_64 = Json::array();
  for (int i = 0; i < 65; ++i) stop_ids_65.push_back(100 + i);
  for (int i = 0; i < 64; ++i) stop_ids_64.push_back(100 + i);
  Json seventeen = Json::array();
  for (int i = 0; i < 17; ++i) seventeen.push_back(absl::StrCat("s", i));
  const std::vector<Bad> completions = {
      {with("n", 5), "'n'"},
      {with("n", 1.5), "'n'"},
      {with("max_tokens", 2.5), "'max_tokens'"},
      {with("best_of", 2), "'best_of'"},
      {with("logprobs", true), "'logprobs'"},
      {with("logprobs", 5), "'logprobs'"},
      {with("top_logprobs", 3), "'top_logprobs'"},
      {with("logit_bias", {{"11", 5}}), "'logit_bias'"},
      {with("stop", seventeen), "'stop'"},
      {with("stop", std::string(1025, 'x')), "'stop'"},
      {with("stop", Json::array({"ok", std::string(1025, 'x')})), "'stop'"},
      {with("stop_token_ids", stop_ids_65), "'stop_token_ids'"},
      {with("user", std::string(129, 'u')), "'user'"},
      {with("user", 7), "'user'"},
      // Sampling we do not implement: refused, never silently ignored (H4's probe: 200 before).
      {with("frequency_penalty", 0.5), "'frequency_penalty'"},
      {with("presence_penalty", -1), "'presence_penalty'"},
      {with("presence_penalty", "x"), "'presence_penalty'"},
      {with("repetition_penalty", 1.2), "'repetition_penalty'"},
      {with("response_format", {{"type", "json_object"}}), "'response_format'"},
      {with("stream_options", Json::array({1})), "'stream_options'"},
  };
  const int calls = w->total_calls();
  for (const Bad& b : completions) ExpectRefused(port(), "/v1/completions", b);

  const Json hello = {{"role", "user"}, {"content", "Hello"}};
  const Json chat = {{"model", "qwen-test"}, {"messages", {hello}}, {"max_tokens", 2}};
  const auto chat_with = [&](const char* key, Json value) {
    Json b = chat;
    b[key] = std::move(value);
    return b;
  };
  Json many_messages = Json::array();
  for (int i = 0; i < 2049; ++i) many_messages.push_back(hello);
  const Json tool = {{"type", "function"},
                     {"function", {{"name", "f"}, {"parameters", Json::object()}}}};
  Json many_tools = Json::array();
  for (int i = 0; i < 129; ++i) many_tools.push_back(tool);
  Json big_tool = tool;
  big_tool["function"]["description"] = std::string(300 << 10, 'd');
  const std::vector<Bad> chats = {
      {chat_with("messages", many_messages), "'messages'"},
      {chat_with("messages", {{{"role", "user"}, {"content", std::string((1 << 20) + 1, 'm')}}}),
       "'messages'"},
      {chat_with("tools", many_tools), "'tools'"},
      {chat_with("tools", Json::array({big_tool})), "'tools'"},
      {chat_with("tools", "search"), "'tools'"},
      {chat_with("user", std::string(129, 'u')), "'user'"},
  };
  for (const Bad& b : chats) ExpectRefused(port(), "/v1/chat/completions", b);
  // /tokenize renders the same messages: the same bounds (before, any list was rendered, ints
  // and 100,000 messages included).
  for (const Bad& b : std::vector<Bad>{{{{"messages", many_messages}}, "'messages'"},
                                       {{{"messages", {1, 2}}}, "'messages'"}}) {
    ExpectRefused(port(), "/tokenize", b);
  }
  EXPECT_EQ(w->total_calls(), calls) << "no bad request reached a worker";

  // The edges are served: n at its limit, best_of 1, false logprobs, an empty logit_bias, 16
  // stop strings of 1024 bytes, 64 stop ids, a 128-byte user, 128 tools.
  Json edge = base;
  edge["n"] = 4;
  edge["best_of"] = 1;
  edge["logprobs"] = false;
  edge["logit_bias"] = Json::object();
  edge["stop"] = Json::array();
  for (int i = 0; i < 16; ++i)
    edge["stop"].push_back(std::string(1023, 'a') + std::to_string(i % 10));
  edge["stop_token_ids"] = stop_ids_64;
  edge["user"] = std::string(128, 'u');
  edge["frequency_penalty"] = 0;
  edge["presence_penalty"] = 0.0;
  edge["repetition_penalty"] = 1;
  edge["response_format"] = {{"type", "text"}};
  http::TestResponse r = Post(port(), "/v1/completions", edge);
  EXPECT_EQ(r.status, 200) << r.body;
  Json tools = Json::array();
  for (int i = 0; i < 128; ++i) tools.push_back(tool);
  r = Post(port(), "/v1/chat/completions", chat_with("tools", tools));
  EXPECT_EQ(r.status, 200) << r.body;
}

// OpenAI's content parts (what the `openai` client sends for multi-part messages) are the text
// they hold, joined by "\n"; parts the model cannot read are a 400 naming the message. Before
// (H4's probe) every list content was a 400 from the template: "can only concatenate str".
TEST_F(HttpFieldsTest, TextContentPartsAreTheirTextAndOtherPartsA400) {
  FakeWorker* w = AddWorker();
  const auto tokens = [&](const Json& content) {
    const Json messages = {{{"role", "system"}, {"content", "Be brief."}},
                           {{"role", "user"}, {"content", content}}};
    const http::TestResponse r = Post(port(), "/tokenize", {{"messages", messages}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body)["tokens"] : Json();
  };
  const Json parts = {{{"type", "text"}, {"text", "Hi 👋"}}, {{"type", "text"}, {"text", "there"}}};
  EXPECT_EQ(tokens(parts), tokens("Hi 👋\nthere"));
  EXPECT_EQ(tokens(Json::array({parts[0]})), tokens("Hi 👋"));
  const Json chat = {{"model", "qwen-test"},
                     {"messages", {{{"role", "user"}, {"content", parts}}}},
                     {"max_tokens", 2}};
  const int calls = w->total_calls();
  http::TestResponse r = Post(port(), "/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GT(w->total_calls(), calls);
  const auto with_content = [&](Json content) {
    Json b = chat;
    b["messages"][0]["content"] = std::move(content);
    return b;
  };
  const Json image = {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}};
  const int before_bad = w->total_calls();
  for (const Bad& b : std::vector<Bad>{
           {with_content(Json::array({parts[0], image})),
            "'messages[0].content' holds a part of "
            "type 'image_url'"},
           {with_content(Json::array({"text"})), "'messages[0].content' parts must be objects"},
           {with_content(Json::array({{{"type", "text"}, {"text", 5}}})),
            "'messages[0].content' text parts need a string 'text'"},
       }) {
    ExpectRefused(port(), "/v1/chat/completions", b);
  }
  EXPECT_EQ(w->total_calls(), before_bad) << "no bad request reached a worker";
}

// OpenAI's chat fields we do not implement: their neutral values are served (the `openai`
// client sends only what it is given), a value asking for what we lack is a 400 naming the
// field. Before, every one of these was accepted and silently ignored.
TEST_F(HttpFieldsTest, UnimplementedOpenAIFieldsServeTheirNeutralValueAndRefuseTheRest) {
  FakeWorker* w = AddWorker();
  const Json chat = {{"model", "qwen-test"},
                     {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                     {"max_tokens", 2}};
  const Json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  const std::vector<std::pair<const char*, std::vector<Json>>> refused = {
      {"tool_choice", {"auto", "required", {{"type", "function"}, {"function", {{"name", "f"}}}}}},
      {"function_call", {"auto", {{"name", "f"}}}},
      {"functions", {Json::array({tool["function"]})}},
      {"parallel_tool_calls", {"yes"}},
      {"service_tier", {"flex", "priority"}},
      {"store", {true}},
      {"metadata", {{{"k", "v"}}}},
      {"modalities", {Json::array({"text", "audio"}), Json::array({"audio"})}},
      {"audio", {{{"voice", "alloy"}, {"format", "wav"}}}},
      {"prediction", {{{"type", "content"}, {"content", "x"}}}},
      {"reasoning_effort", {"low", "high"}},
      {"web_search_options", {Json::object()}},
      {"suffix", {"end"}},
      {"echo", {true}},
      {"best_of", {3}},
      {"logit_bias", {{{"11", -100}}}},
  };
  const int calls = w->total_calls();
  for (const auto& [key, values] : refused) {
    for (const Json& v : values) {
      Json b = chat;
      b[key] = v;
      ExpectRefused(port(), "/v1/chat/completions", {b, absl::StrCat("'", key, "'")});
    }
  }
  EXPECT_EQ(w->total_calls(), calls) << "no refused request reached a worker";

  Json neutral = chat;
  for (const auto& [key, value] : std::vector<std::pair<const char*, Json>>{
           {"tools", Json::array({tool})},
           {"tool_choice", "none"},
           {"function_call", "none"},
           {"functions", Json::array()},
           {"parallel_tool_calls", true},
           {"user", "someone"},
           {"service_tier", "auto"},
           {"store", false},
           {"metadata", Json::object()},
           {"modalities", Json::array({"text"})},
           {"audio", nullptr},
           {"prediction", nullptr},
           {"reasoning_effort", nullptr},
           {"web_search_options", nullptr},
           {"suffix", ""},
           {"echo", false},
           {"best_of", 1},
           {"logit_bias", Json::object()},
       }) {
    neutral[key] = value;
  }
  const http::TestResponse r = Post(port(), "/v1/chat/completions", neutral);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GT(w->total_calls(), calls);
}

// Item 7: out-of-range ids are a 400 naming the field, never wrapped to a small id.
TEST_F(HttpFieldsTest, TokenIdsNeverWrap) {
  FakeWorker* w = AddWorker();
  const int calls = w->total_calls();
  const Json base = {{"model", "qwen-test"}, {"prompt", "hi"}, {"max_tokens", 2}};
  // Big numbers as JSON text: 2^32, 2^32 + 100, 2^63, 2^64 - 1, and -1.
  const std::vector<std::string> out_of_range = {
      "4294967296",           "4294967396", "9223372036854775808",
      "18446744073709551615", "-1",         std::to_string(vocab_)};
  for (const std::string& id : out_of_range) {
    SCOPED_TRACE(id);
    Json b = base;
    b["stop_token_ids"] = Json::parse(absl::StrCat("[", id, "]"));
    ExpectRefused(port(), "/v1/completions", {b, "'stop_token_ids'"});
    Json p = base;
    p["prompt"] = Json::parse(absl::StrCat("[", id, "]"));
    ExpectRefused(port(), "/v1/completions", {p, "'prompt'"});
    const http::TestResponse d =
        http::HttpCall(port(), "POST", "/detokenize", absl::StrCat(R"({"tokens": [0, )", id, "]}"));
    EXPECT_EQ(d.status, 400) << d.body;
    EXPECT_NE(d.body.find("'tokens'"), std::string::npos) << d.body;
  }
  EXPECT_EQ(w->total_calls(), calls) << "no bad request reached a worker";
  // In range: served and decoded as themselves.
  const http::TestResponse d =
      http::HttpCall(port(), "POST", "/detokenize", R"({"tokens": [0, 100]})");
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(Json::parse(d.body)["prompt"], *api_->model().tokenizer->Decode({0, 100}, false));
  Json ok = base;
  ok["stop_token_ids"] = {0, vocab_ - 1};
  EXPECT_EQ(Post(port(), "/v1/completions", ok).status, 200);
}

// Item 6: the HTTP API asks the workers for ids below its tokenizer's size (vocab_limit); a
// worker that returns one past it anyway is a server fault: 500 server_error, never a 400.
TEST_F(HttpFieldsTest, TheApiAsksForDecodableIdsAndAnUndecodableOneIsAServerError) {
  // A prompt id whose successor over the whole embedding is a padding id (>= the tokenizer's
  // size): a worker that honours vocab_limit never goes there.
  uint32_t prompt_id = 0;
  while (FakeNextToken(prompt_id, kQwenEmbeddingRows) < vocab_) ++prompt_id;
  ASSERT_LT(prompt_id, vocab_);
  const uint32_t padding = FakeNextToken(prompt_id, kQwenEmbeddingRows);
  const Json req = {{"model", "qwen-test"}, {"prompt", {prompt_id}}, {"max_tokens", 3}};
  {
    RouterHarness honouring;
    honouring.AddWorker("h", v1::WORKER_ROLE_MIXED,
                        [](FakeWorkerOptions& o) { o.vocab_size = kQwenEmbeddingRows; });
    auto model = ServedModel::Load(ModelDir(), "qwen-test");
    ASSERT_TRUE(model.ok()) << model.status();
    auto api = HttpApi::Start(HttpApiOptions(), *std::move(model), &honouring.server().registry(),
                              &honouring.server().requests(), &honouring.server().orchestrator());
    ASSERT_TRUE(api.ok()) << api.status();
    const http::TestResponse r = Post((*api)->port(), "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.body << " (the API did not send vocab_limit = " << vocab_ << ")";
  }
  AddWorker(/*ignore_vocab_limit=*/true);
  const http::TestResponse whole = Post(port(), "/v1/completions", req);
  EXPECT_EQ(whole.status, 500) << whole.body;
  const Json error = Json::parse(whole.body)["error"];
  EXPECT_EQ(error["type"], "server_error") << whole.body;
  EXPECT_NE(error["message"].get<std::string>().find(std::to_string(padding)), std::string::npos)
      << whole.body;

  Json streamed = req;
  streamed["stream"] = true;
  const http::TestResponse sse = Post(port(), "/v1/completions", streamed);
  EXPECT_EQ(sse.status, 200);  // the stream had started
  bool saw_error = false;
  for (absl::string_view part : absl::StrSplit(sse.body, "\n\n", absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&part, "data: ") || part == "[DONE]") continue;
    const Json event = Json::parse(std::string(part));
    if (!event.contains("error")) continue;
    saw_error = true;
    EXPECT_EQ(event["error"]["type"], "server_error") << part;
    EXPECT_EQ(event["error"]["code"], 500) << part;
  }
  EXPECT_TRUE(saw_error) << sse.body;
}

}  // namespace
}  // namespace tandem::router::openai
