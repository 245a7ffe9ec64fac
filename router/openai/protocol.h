// OpenAI-compatible request parsing and response bodies for the router's HTTP API
// (http_api.h): `POST /v1/completions` and `/v1/chat/completions` bodies become validated
// CompletionParams (errors name the field, as OpenAI's 400s do), and the results become
// OpenAI's JSON (whole responses, SSE chunks, usage).
//
// Thread safety: pure functions; ServedModel is immutable after Load.
#ifndef TANDEM_ROUTER_OPENAI_PROTOCOL_H_
#define TANDEM_ROUTER_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/chat/chat_template.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::router::openai {

// What the router knows of the model it serves text for: tokenizer and chat template files and
// config.json (no weights).
struct ServedModel {
  std::string name;  // --served_model_name (default: the directory's name)
  std::unique_ptr<tokenizer::TextTokenizer> tokenizer;
  std::unique_ptr<tokenizer::chat::ChatTemplate> chat_template;  // null: none in the files
  std::string bos_token, eos_token;
  int64_t max_model_len = 0;
  // NOT_FOUND / INVALID_ARGUMENT naming the file that is missing or bad.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Load(const std::string& dir,
                                                           const std::string& served_name);
};

// Bounds on the fields of a body (each violation is a 400 naming the field). `user` becomes the
// cache salt and `stop_token_ids` the request's stop ids, so those two are bounded by the wire
// limits every entry shares (proto/tandem/v1/limits.h: kMaxIdBytes, kMaxStopTokenIds).
struct ApiLimits {
  int max_n = 4;
  uint32_t default_max_tokens = 256;
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 1024;
  size_t max_messages = 2048;
  size_t max_message_bytes = size_t{1} << 20;  // one message, as JSON
  size_t max_tools = 128;
  size_t max_tools_bytes = size_t{256} << 10;  // the whole `tools` list, as JSON
};

struct CompletionParams {
  bool chat = false;
  std::string model;
  std::vector<std::vector<uint32_t>> prompts;  // one per prompt (completions may batch)
  uint32_t max_tokens = 0;
  float temperature = 1.0f, top_p = 1.0f;
  uint32_t top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<uint32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  std::string user;  // cache salt
};

// A JSON token id in [0, vocab_size), or nullopt: not an integer, negative, or too large (never
// wrapped: 2^32 is not id 0, 2^63 not id 0 either).
std::optional<uint32_t> TokenIdOf(const nlohmann::json& value, int64_t vocab_size);

// A chat body's `messages` (a non-empty list of objects with a string role, at most
// `limits.max_messages` of at most `max_message_bytes`) and `tools` (bounded the same way):
// INVALID_ARGUMENT naming the field. ParseCompletion and /tokenize check it before rendering.
absl::Status CheckChatShape(const nlohmann::json& body, const ApiLimits& limits);

// INVALID_ARGUMENT naming the field for a bad body; NOT_FOUND for another model's name.
absl::StatusOr<CompletionParams> ParseCompletion(const nlohmann::json& body, bool chat,
                                                 const ServedModel& model, const ApiLimits& limits);

// OpenAI's content parts (`"content": [{"type": "text", "text": ...}, ...]`) as the one string
// chat templates expect: the texts joined by "\n" (vLLM's rendering for string-content
// templates). A part of another type (image_url, input_audio, ...) or a malformed part is
// INVALID_ARGUMENT naming `messages[i].content`: the model reads text only. Other messages and
// non-list input are returned as they are.
absl::StatusOr<nlohmann::ordered_json> FlattenContentParts(const nlohmann::ordered_json& messages);

// The chat template applied to `messages` (content parts flattened, above; with the generation
// prompt) and tokenized.
absl::StatusOr<std::vector<uint32_t>> RenderChat(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 const ServedModel& model);

struct Choice {
  int index = 0;
  std::string text;
  std::string finish_reason;  // "stop" | "length" | "" (not finished)
};
struct UsageCounts {
  uint64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

nlohmann::json CompletionBody(bool chat, const std::string& id, int64_t created,
                              const std::string& model, const std::vector<Choice>& choices,
                              const UsageCounts& usage);
// One SSE chunk's JSON: a text delta of choice `c` (chat: `delta.content`, with the role on the
// first chunk), or its finish reason.
nlohmann::json ChunkBody(bool chat, const std::string& id, int64_t created,
                         const std::string& model, const Choice& c, bool first);
nlohmann::json UsageChunkBody(bool chat, const std::string& id, int64_t created,
                              const std::string& model, const UsageCounts& usage);
nlohmann::json UsageJson(const UsageCounts& usage);

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_PROTOCOL_H_
