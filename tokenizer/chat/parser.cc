#include "tokenizer/chat/parser.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/parser_internal.h"

namespace tandem::tokenizer::chat {
namespace parser_internal {

absl::StatusOr<Body> Parser::ParseBody(std::initializer_list<absl::string_view> ends,
                                       std::string* end) {
  Body body;
  while (true) {
    const Token& tok = Cur();
    if (tok.type == T::kEof) {
      if (ends.size() == 0) return body;
      return Error(absl::StrCat("unexpected end of template, expected '", *ends.begin(), "'"));
    }
    if (tok.type == T::kText) {
      auto node = std::make_unique<Node>();
      node->kind = Node::Kind::kText;
      node->text = tok.text;
      body.push_back(std::move(node));
      Advance();
    } else if (tok.type == T::kVarBegin) {
      Advance();
      auto node = std::make_unique<Node>();
      node->kind = Node::Kind::kOutput;
      node->line = tok.line;
      ASSIGN_OR_RETURN(node->expr, ParseTuple(true));
      if (Cur().type != T::kVarEnd) return Error("expected '}}'");
      Advance();
      body.push_back(std::move(node));
    } else if (tok.type == T::kBlockBegin) {
      const Token& tag = Peek();
      for (absl::string_view e : ends) {
        if (tag.type == T::kName && tag.text == e) {
          *end = tag.text;
          pos_ += 2;
          return body;
        }
      }
      Advance();
      ASSIGN_OR_RETURN(NodePtr node, ParseStatement());
      body.push_back(std::move(node));
    } else {
      return Error("unexpected token");
    }
  }
}

absl::StatusOr<NodePtr> Parser::ParseStatement() {
  if (Cur().type != T::kName) return Error("expected a tag name");
  const std::string tag = Cur().text;
  const int line = Cur().line;
  Advance();
  if (tag == "if") return ParseIf();
  if (tag == "for") return ParseFor();
  if (tag == "set") return ParseSet();
  auto node = std::make_unique<Node>();
  node->line = line;
  if (tag == "break" || tag == "continue") {
    node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }
  if (tag == "generation") {  // transformers' AssistantTracker: renders its body unchanged.
    node->kind = Node::Kind::kBlock;
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ASSIGN_OR_RETURN(node->body, ParseBody({"endgeneration"}, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }
  static constexpr absl::string_view kJinjaTags[] = {
      "macro", "call", "filter", "block", "extends",    "include", "import",
      "from",  "with", "do",     "raw",   "autoescape", "trans",   "pluralize"};
  for (absl::string_view known : kJinjaTags) {
    if (tag == known)
      return absl::UnimplementedError(absl::StrCat("unsupported Jinja tag '", tag, "'"));
  }
  return Error(absl::StrCat("unknown tag '", tag, "'"));
}

absl::StatusOr<NodePtr> Parser::ParseIf() {
  auto node = std::make_unique<Node>();
  node->kind = Node::Kind::kIf;
  node->line = Cur().line;
  ASSIGN_OR_RETURN(node->expr, ParseTuple(true));
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  ASSIGN_OR_RETURN(node->body, ParseBody({"elif", "else", "endif"}, &end));
  if (end == "elif") {
    ASSIGN_OR_RETURN(NodePtr elif, ParseIf());
    node->else_body.push_back(std::move(elif));
    return node;
  }
  RETURN_IF_ERROR(ExpectBlockEnd());
  if (end == "else") {
    ASSIGN_OR_RETURN(node->else_body, ParseBody({"endif"}, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
  }
  return node;
}

absl::StatusOr<NodePtr> Parser::ParseFor() {
  auto node = std::make_unique<Node>();
  node->kind = Node::Kind::kFor;
  node->line = Cur().line;
  const bool parenthesized = IsOp("(");
  if (parenthesized) Advance();
  while (true) {
    ASSIGN_OR_RETURN(std::string target, ExpectName());
    node->targets.push_back(std::move(target));
    if (!IsOp(",")) break;
    Advance();
    if (IsName("in") || IsOp(")")) break;
  }
  if (parenthesized) RETURN_IF_ERROR(ExpectOp(")"));
  if (!IsName("in")) return Error("expected 'in' in for loop");
  Advance();
  ASSIGN_OR_RETURN(node->expr, ParseTuple(/*with_condexpr=*/false));
  if (IsName("if")) {
    Advance();
    ASSIGN_OR_RETURN(node->filter, ParseExpression());
  }
  if (IsName("recursive"))
    return absl::UnimplementedError("unsupported Jinja construct 'recursive' for loop");
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  ASSIGN_OR_RETURN(node->body, ParseBody({"else", "endfor"}, &end));
  RETURN_IF_ERROR(ExpectBlockEnd());
  if (end == "else") {
    ASSIGN_OR_RETURN(node->else_body, ParseBody({"endfor"}, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
  }
  return node;
}

absl::StatusOr<NodePtr> Parser::ParseSet() {
  auto node = std::make_unique<Node>();
  node->kind = Node::Kind::kSet;
  node->line = Cur().line;
  ASSIGN_OR_RETURN(std::string first, ExpectName());
  node->targets.push_back(std::move(first));
  if (IsOp(".")) {
    Advance();
    ASSIGN_OR_RETURN(node->attr, ExpectName());
  } else {
    while (IsOp(",")) {
      Advance();
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      node->targets.push_back(std::move(target));
    }
  }
  if (IsOp("=")) {
    Advance();
    ASSIGN_OR_RETURN(node->expr, ParseTuple(true));
    RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }
  if (IsOp("|")) return absl::UnimplementedError("unsupported Jinja construct: filtered block set");
  if (!node->attr.empty() || node->targets.size() != 1) return Error("expected '='");
  node->kind = Node::Kind::kSetBlock;
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  ASSIGN_OR_RETURN(node->body, ParseBody({"endset"}, &end));
  RETURN_IF_ERROR(ExpectBlockEnd());
  return node;
}

}  // namespace parser_internal

absl::StatusOr<Body> ParseTemplate(const std::vector<Token>& tokens) {
  return parser_internal::Parser(tokens).Run();
}

}  // namespace tandem::tokenizer::chat
