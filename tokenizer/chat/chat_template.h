// Native rendering of Hugging Face chat templates: a Jinja subset interpreter that reproduces,
// byte for byte, what transformers' `apply_chat_template` renders with Python jinja2
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) + loopcontrols, and
// transformers' tojson / raise_exception / strftime_now / namespace / dict).
//
// Constructs outside the supported subset (README.md) fail Parse or Render with an
// UNIMPLEMENTED error naming them, never a silently different output. A template calling
// raise_exception(msg) makes Render return INVALID_ARGUMENT with exactly `msg`.
//
// Context key order: Python dicts keep insertion order, which `tojson` and `items()` expose.
// nlohmann::json sorts object keys; pass nlohmann::ordered_json to keep the order of the
// original JSON document.
//
// Thread safety: a parsed ChatTemplate is immutable; Render may be called concurrently.
#ifndef TANDEM_TOKENIZER_CHAT_CHAT_TEMPLATE_H_
#define TANDEM_TOKENIZER_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer::chat {

struct Node;
class Value;

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Tokenizes and parses `source` (the `chat_template` string of tokenizer_config.json).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(absl::string_view source);

  // `context` is an object: `messages` (array of {role, content, ...}), `add_generation_prompt`,
  // `bos_token`, `eos_token`, optionally `tools`, `documents` and any extra keys, exactly the
  // keyword arguments transformers passes to render().
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  ChatTemplate();
  absl::StatusOr<std::string> RenderValue(const Value& context) const;

  std::vector<std::unique_ptr<Node>> body_;
};

// The chat template of a tokenizer_config.json: `chat_template` as a string, or as a list of
// {name, template} (the one named "default"). NOT_FOUND when there is none.
absl::StatusOr<std::string> ChatTemplateFromConfig(const nlohmann::json& tokenizer_config);

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_CHAT_TEMPLATE_H_
