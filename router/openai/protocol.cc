#include "router/openai/protocol.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tandem/v1/limits.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

absl::StatusOr<Json> ReadJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream s;
  s << in.rdbuf();
  Json j = Json::parse(s.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": bad JSON"));
  return j;
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string TokenText(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

absl::Status Field(const std::string& name, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' ", problem));
}

template <typename T>
absl::Status Number(const Json& body, const char* key, T lo, T hi, T* out) {
  if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
  if (!body[key].is_number()) return Field(key, "must be a number");
  if constexpr (std::is_integral_v<T>) {
    if (!body[key].is_number_integer()) return Field(key, "must be an integer");
  }
  const double v = body[key].get<double>();
  if (v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
    return Field(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = static_cast<T>(v);
  return absl::OkStatus();
}

absl::Status Bool(const Json& body, const char* key, bool* out) {
  if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
  if (!body[key].is_boolean()) return Field(key, "must be a boolean");
  *out = body[key].get<bool>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> TokenIds(const Json& list, const ServedModel& model,
                                               const std::string& field) {
  std::vector<uint32_t> ids;
  for (const Json& t : list) {
    const std::optional<uint32_t> id = TokenIdOf(t, model.tokenizer->vocab_size());
    if (!id.has_value()) {
      return Field(
          field, absl::StrCat("holds a token id outside [0, ", model.tokenizer->vocab_size(), ")"));
    }
    ids.push_back(*id);
  }
  if (ids.empty()) return Field(field, "is empty");
  return ids;
}

absl::StatusOr<std::vector<uint32_t>> EncodeText(const std::string& text, const ServedModel& model,
                                                 bool special) {
  auto ids = model.tokenizer->Encode(text, special);
  if (!ids.ok()) return Field("prompt", std::string(ids.status().message()));
  if (ids->empty()) return Field("prompt", "encodes to no tokens");
  return std::vector<uint32_t>(ids->begin(), ids->end());
}

absl::Status ParsePrompts(const Json& prompt, const ServedModel& model, CompletionParams* p) {
  if (prompt.is_string()) {
    auto ids = EncodeText(prompt.get<std::string>(), model, true);
    if (!ids.ok()) return ids.status();
    p->prompts.push_back(*std::move(ids));
    return absl::OkStatus();
  }
  if (!prompt.is_array() || prompt.empty()) {
    return Field("prompt", "must be a string, a list of strings, or token ids");
  }
  if (prompt[0].is_number()) {
    auto ids = TokenIds(prompt, model, "prompt");
    if (!ids.ok()) return ids.status();
    p->prompts.push_back(*std::move(ids));
    return absl::OkStatus();
  }
  for (const Json& item : prompt) {
    absl::StatusOr<std::vector<uint32_t>> ids =
        item.is_string()  ? EncodeText(item.get<std::string>(), model, true)
        : item.is_array() ? TokenIds(item, model, "prompt")
                          : absl::StatusOr<std::vector<uint32_t>>(
                                Field("prompt", "items must be strings or token id lists"));
    if (!ids.ok()) return ids.status();
    p->prompts.push_back(*std::move(ids));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& body, const ServedModel& model, const ApiLimits& limits,
                       CompletionParams* p) {
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& stop = body["stop"];
    if (stop.is_string()) {
      p->stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > limits.max_stop_strings) {
        return Field("stop", absl::StrCat("has more than ", limits.max_stop_strings, " strings"));
      }
      for (const Json& s : stop) {
        if (!s.is_string()) return Field("stop", "must be a string or a list of strings");
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return Field("stop", "must be a string or a list of strings");
    }
    for (const std::string& s : p->stop) {
      if (s.size() > limits.max_stop_string_bytes) {
        return Field("stop", absl::StrCat("holds a string of ", s.size(), " bytes; the limit is ",
                                          limits.max_stop_string_bytes));
      }
    }
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const Json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return Field("stop_token_ids", "must be a list");
    if (ids.size() > static_cast<size_t>(v1::kMaxStopTokenIds)) {
      return Field("stop_token_ids",
                   absl::StrCat("has ", ids.size(), " ids; the limit is ", v1::kMaxStopTokenIds));
    }
    for (const Json& t : ids) {
      const std::optional<uint32_t> id = TokenIdOf(t, model.tokenizer->vocab_size());
      if (!id.has_value()) {
        return Field("stop_token_ids", absl::StrCat("holds a token id outside [0, ",
                                                    model.tokenizer->vocab_size(), ")"));
      }
      p->stop_token_ids.push_back(*id);
    }
  }
  return absl::OkStatus();
}

// `user` (the cache salt): a string of at most kMaxIdBytes, the bound the workers enforce.
absl::Status ParseUser(const Json& body, CompletionParams* p) {
  if (!body.contains("user") || body["user"].is_null()) return absl::OkStatus();
  if (!body["user"].is_string()) return Field("user", "must be a string");
  p->user = body["user"].get<std::string>();
  if (p->user.size() > static_cast<size_t>(v1::kMaxIdBytes)) {
    return Field("user",
                 absl::StrCat("is ", p->user.size(), " bytes; the limit is ", v1::kMaxIdBytes));
  }
  return absl::OkStatus();
}

bool IsFalse(const Json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsNumber(const Json& v, double x) { return v.is_number() && v.get<double>() == x; }
// An empty object or list (nlohmann's empty() is false for every string).
bool IsEmpty(const Json& v) { return (v.is_object() || v.is_array()) && v.empty(); }
bool Never(const Json&) { return false; }

// The OpenAI request fields we do not implement, each with the values that ask for nothing we
// lack (absent and null always do). Any other value is a 400 naming the field: served without
// it the output would silently not be what was asked for. `tools` is not here: the chat
// template renders them (the model may answer with a call, as text); `user` is the cache salt.
struct UnsupportedField {
  const char* key;
  bool (*neutral)(const Json&);
};
constexpr UnsupportedField kUnsupportedFields[] = {
    {"logprobs", IsFalse},
    {"top_logprobs", [](const Json& v) { return IsNumber(v, 0); }},
    {"echo", IsFalse},
    {"best_of", [](const Json& v) { return v.is_number_integer() && v == 1; }},
    {"suffix", [](const Json& v) { return v == ""; }},
    {"logit_bias", [](const Json& v) { return v.is_object() && IsEmpty(v); }},
    {"presence_penalty", [](const Json& v) { return IsNumber(v, 0); }},
    {"frequency_penalty", [](const Json& v) { return IsNumber(v, 0); }},
    {"repetition_penalty", [](const Json& v) { return IsNumber(v, 1); }},
    {"response_format",
     [](const Json& v) { return v.is_object() && v.value("type", Json()) == "text"; }},
    // Tool calls are not parsed out of the text: only "none" (vLLM without a tool parser too).
    {"tool_choice", [](const Json& v) { return v == "none"; }},
    {"function_call", [](const Json& v) { return v == "none"; }},
    {"functions", [](const Json& v) { return v.is_array() && IsEmpty(v); }},
    {"parallel_tool_calls", [](const Json& v) { return v.is_boolean(); }},
    {"service_tier", [](const Json& v) { return v == "auto" || v == "default"; }},
    {"store", IsFalse},
    {"metadata", [](const Json& v) { return v.is_object() && IsEmpty(v); }},
    {"modalities", [](const Json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }},
    {"audio", Never},
    {"prediction", Never},
    {"reasoning_effort", Never},
    {"web_search_options", Never},
};

absl::Status RefuseUnsupported(const Json& body) {
  for (const UnsupportedField& f : kUnsupportedFields) {
    if (!body.contains(f.key)) continue;
    const Json& v = body[f.key];
    if (!v.is_null() && !f.neutral(v)) return Field(f.key, "is not supported");
  }
  return absl::OkStatus();
}

// Chat bodies: the message list and the tools the template sees, bounded in count and size
// (the template renders all of it).
absl::Status ChatShape(const Json& body, const ApiLimits& limits) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return Field("messages", "must be a non-empty list");
  }
  const Json& messages = body["messages"];
  if (messages.size() > limits.max_messages) {
    return Field("messages", absl::StrCat("has ", messages.size(), " messages; the limit is ",
                                          limits.max_messages));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Field("messages", "items must be objects with a string 'role'");
    }
    const size_t bytes = m.dump().size();
    if (bytes > limits.max_message_bytes) {
      return Field("messages", absl::StrCat("[", i, "] is ", bytes, " bytes of JSON; the limit is ",
                                            limits.max_message_bytes));
    }
  }
  if (!body.contains("tools") || body["tools"].is_null()) return absl::OkStatus();
  const Json& tools = body["tools"];
  if (!tools.is_array()) return Field("tools", "must be a list");
  if (tools.size() > limits.max_tools) {
    return Field("tools",
                 absl::StrCat("has ", tools.size(), " tools; the limit is ", limits.max_tools));
  }
  for (const Json& t : tools) {
    if (!t.is_object()) return Field("tools", "items must be objects");
  }
  const size_t bytes = tools.dump().size();
  if (bytes > limits.max_tools_bytes) {
    return Field("tools", absl::StrCat("is ", bytes, " bytes of JSON; the limit is ",
                                       limits.max_tools_bytes));
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const Json& body, const ServedModel& model, const ApiLimits& limits,
                           CompletionParams* p) {
  p->max_tokens = limits.default_max_tokens;
  const char* max_key =
      body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (absl::Status s = Number<uint32_t>(body, max_key, 1, 1u << 20, &p->max_tokens); !s.ok()) {
    return s;
  }
  if (absl::Status s = Number<float>(body, "temperature", 0.0f, 2.0f, &p->temperature); !s.ok()) {
    return s;
  }
  if (absl::Status s = Number<float>(body, "top_p", 0.0f, 1.0f, &p->top_p); !s.ok()) return s;
  int64_t top_k = 0;
  if (absl::Status s = Number<int64_t>(body, "top_k", -1, 1 << 20, &top_k); !s.ok()) return s;
  p->top_k = top_k < 0 ? 0 : static_cast<uint32_t>(top_k);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return Field("seed", "must be an integer");
    p->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (absl::Status s = Number<int>(body, "n", 1, limits.max_n, &p->n); !s.ok()) return s;
  if (absl::Status s = Bool(body, "ignore_eos", &p->ignore_eos); !s.ok()) return s;
  if (absl::Status s = Bool(body, "skip_special_tokens", &p->skip_special_tokens); !s.ok()) {
    return s;
  }
  if (absl::Status s = Bool(body, "stream", &p->stream); !s.ok()) return s;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    if (!body["stream_options"].is_object()) return Field("stream_options", "must be an object");
    if (absl::Status s = Bool(body["stream_options"], "include_usage", &p->include_usage);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = RefuseUnsupported(body); !s.ok()) return s;
  if (absl::Status s = ParseUser(body, p); !s.ok()) return s;
  return ParseStop(body, model, limits, p);
}

}  // namespace

absl::Status CheckChatShape(const Json& body, const ApiLimits& limits) {
  return ChatShape(body, limits);
}

std::optional<uint32_t> TokenIdOf(const Json& value, int64_t vocab_size) {
  // An unsigned JSON number may exceed int64 (2^63 would read as negative), a signed one may be
  // negative: each is read as what it is, and only then compared.
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (vocab_size > 0 && v < static_cast<uint64_t>(vocab_size)) return static_cast<uint32_t>(v);
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0 && v < vocab_size) return static_cast<uint32_t>(v);
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(const std::string& dir,
                                                               const std::string& served_name) {
  auto m = std::make_unique<ServedModel>();
  const std::filesystem::path path(dir);
  m->name = served_name.empty() ? path.filename().string() : served_name;
  absl::StatusOr<std::unique_ptr<tokenizer::TextTokenizer>> tok = tokenizer::LoadTokenizer(dir);
  if (!tok.ok()) return tok.status();
  m->tokenizer = *std::move(tok);
  absl::StatusOr<Json> config = ReadJsonFile(path / "config.json");
  if (!config.ok()) return config.status();
  m->max_model_len = config->value("max_position_embeddings", int64_t{0});
  std::string template_source;
  if (std::filesystem::exists(path / "tokenizer_config.json")) {
    absl::StatusOr<Json> tc = ReadJsonFile(path / "tokenizer_config.json");
    if (!tc.ok()) return tc.status();
    m->bos_token = TokenText(*tc, "bos_token");
    m->eos_token = TokenText(*tc, "eos_token");
    absl::StatusOr<std::string> t = tokenizer::chat::ChatTemplateFromConfig(*tc);
    if (t.ok()) template_source = *t;
  }
  if (std::filesystem::exists(path / "chat_template.jinja")) {
    std::ifstream in(path / "chat_template.jinja");
    std::stringstream s;
    s << in.rdbuf();
    template_source = s.str();
  }
  if (!template_source.empty()) {
    auto parsed = tokenizer::chat::ChatTemplate::Parse(template_source);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat(dir, ": chat template: ", parsed.status().message()));
    }
    m->chat_template = *std::move(parsed);
  }
  return m;
}

absl::StatusOr<nlohmann::ordered_json> FlattenContentParts(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  if (!out.is_array()) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    nlohmann::ordered_json& m = out[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    const std::string field = absl::StrCat("messages[", i, "].content");
    std::vector<std::string> texts;
    for (const auto& part : m["content"]) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        return Field(field, "parts must be objects with a string 'type'");
      }
      const std::string type = part["type"].get<std::string>();
      if (type != "text") {
        return Field(field, absl::StrCat("holds a part of type '", type.substr(0, 64),
                                         "'; this model reads text only"));
      }
      if (!part.contains("text") || !part["text"].is_string()) {
        return Field(field, "text parts need a string 'text'");
      }
      texts.push_back(part["text"].get<std::string>());
    }
    m["content"] = absl::StrJoin(texts, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> RenderChat(const nlohmann::ordered_json& raw_messages,
                                                 const nlohmann::ordered_json& tools,
                                                 const ServedModel& model) {
  absl::StatusOr<nlohmann::ordered_json> messages = FlattenContentParts(raw_messages);
  if (!messages.ok()) return messages.status();
  if (model.chat_template == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.name, "' has no chat template; use /v1/completions"));
  }
  nlohmann::ordered_json context = {{"messages", *std::move(messages)},
                                    {"add_generation_prompt", true},
                                    {"bos_token", model.bos_token},
                                    {"eos_token", model.eos_token}};
  if (!tools.is_null()) context["tools"] = tools;
  absl::StatusOr<std::string> text = model.chat_template->Render(context);
  if (!text.ok()) {
    return Field("messages",
                 absl::StrCat("rejected by the chat template: ", text.status().message()));
  }
  // The template writes the special tokens itself (transformers: add_special_tokens=False).
  return EncodeText(*text, model, /*special=*/false);
}

absl::StatusOr<CompletionParams> ParseCompletion(const Json& body, bool chat,
                                                 const ServedModel& model,
                                                 const ApiLimits& limits) {
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  CompletionParams p;
  p.chat = chat;
  if (!body.contains("model") || !body["model"].is_string()) {
    return Field("model", "is required (a string)");
  }
  p.model = body["model"].get<std::string>();
  if (p.model != model.name) {
    return absl::NotFoundError(absl::StrCat("The model '", p.model, "' does not exist"));
  }
  if (absl::Status s = ParseSampling(body, model, limits, &p); !s.ok()) return s;
  if (chat) {
    if (absl::Status s = ChatShape(body, limits); !s.ok()) return s;
    // Key order matters to templates that print dicts (tools): keep the client's.
    const auto ordered = nlohmann::ordered_json::parse(body.dump());
    auto ids =
        RenderChat(ordered["messages"],
                   ordered.contains("tools") ? ordered["tools"] : nlohmann::ordered_json(), model);
    if (!ids.ok()) return ids.status();
    p.prompts.push_back(*std::move(ids));
  } else {
    if (!body.contains("prompt")) return Field("prompt", "is required");
    if (absl::Status s = ParsePrompts(body["prompt"], model, &p); !s.ok()) return s;
    if (static_cast<int>(p.prompts.size()) * p.n > limits.max_n * 4) {
      return Field("prompt", "holds too many prompts for one request");
    }
  }
  for (const auto& prompt : p.prompts) {
    if (model.max_model_len > 0 &&
        static_cast<int64_t>(prompt.size() + p.max_tokens) > model.max_model_len) {
      return Field(chat ? "messages" : "prompt",
                   absl::StrCat("is ", prompt.size(), " tokens; with max_tokens ", p.max_tokens,
                                " that exceeds the model's context of ", model.max_model_len));
    }
  }
  return p;
}

Json UsageJson(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json CompletionBody(bool chat, const std::string& id, int64_t created, const std::string& model,
                    const std::vector<Choice>& choices, const UsageCounts& usage) {
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json item = {{"index", c.index}, {"finish_reason", c.finish_reason}, {"logprobs", nullptr}};
    if (chat) {
      item["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      item["text"] = c.text;
    }
    list.push_back(std::move(item));
  }
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(list)},
          {"usage", UsageJson(usage)}};
}

Json ChunkBody(bool chat, const std::string& id, int64_t created, const std::string& model,
               const Choice& c, bool first) {
  Json item = {{"index", c.index}, {"logprobs", nullptr}};
  item["finish_reason"] = c.finish_reason.empty() ? Json(nullptr) : Json(c.finish_reason);
  if (chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!c.text.empty() || (first && c.finish_reason.empty())) delta["content"] = c.text;
    item["delta"] = std::move(delta);
  } else {
    item["text"] = c.text;
  }
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", Json::array({std::move(item)})}};
}

Json UsageChunkBody(bool chat, const std::string& id, int64_t created, const std::string& model,
                    const UsageCounts& usage) {
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", Json::array()},
          {"usage", UsageJson(usage)}};
}

}  // namespace tandem::router::openai
