#include "tokenizer/chat/chat_template.h"

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/ast.h"
#include "tokenizer/chat/eval.h"
#include "tokenizer/chat/lexer.h"
#include "tokenizer/chat/parser.h"
#include "tokenizer/chat/value.h"

namespace tandem::tokenizer::chat {

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  ASSIGN_OR_RETURN(Body body, ParseTemplate(tokens));
  std::unique_ptr<ChatTemplate> tmpl(new ChatTemplate());
  tmpl->body_ = std::move(body);
  return tmpl;
}

absl::StatusOr<std::string> ChatTemplate::RenderValue(const Value& context) const {
  return RenderBody(body_, context);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  if (!context.is_object())
    return absl::InvalidArgumentError("chat template context must be an object");
  return RenderValue(FromJson(context));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object())
    return absl::InvalidArgumentError("chat template context must be an object");
  return RenderValue(FromJson(context));
}

absl::StatusOr<std::string> ChatTemplateFromConfig(const nlohmann::json& tokenizer_config) {
  if (!tokenizer_config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config must be a JSON object");
  }
  const auto it = tokenizer_config.find("chat_template");
  if (it == tokenizer_config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config has no chat_template");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        "chat_template must be a string or a list of {name, template}");
  }
  for (const auto& entry : *it) {
    if (!entry.is_object()) continue;
    const auto name = entry.find("name");
    const auto tmpl = entry.find("template");
    if (name != entry.end() && name->is_string() && name->get<std::string>() == "default" &&
        tmpl != entry.end() && tmpl->is_string()) {
      return tmpl->get<std::string>();
    }
  }
  return absl::NotFoundError("chat_template list has no template named \"default\"");
}

}  // namespace tandem::tokenizer::chat
