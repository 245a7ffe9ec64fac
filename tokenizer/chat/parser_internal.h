// The recursive-descent parser behind ParseTemplate (parser.h), shared by parser.cc
// (statements) and parser_expr.cc (expressions, jinja2's precedence). Internal.
//
// Thread safety: one Parser per parse.
#ifndef TANDEM_TOKENIZER_CHAT_PARSER_INTERNAL_H_
#define TANDEM_TOKENIZER_CHAT_PARSER_INTERNAL_H_

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tokenizer/chat/ast.h"
#include "tokenizer/chat/lexer.h"

namespace tandem::tokenizer::chat {
namespace parser_internal {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  absl::StatusOr<Body> Run() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  bool IsOp(absl::string_view op) const { return Cur().type == T::kOp && Cur().text == op; }
  bool IsName(absl::string_view name) const { return Cur().type == T::kName && Cur().text == name; }
  void Advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("template syntax error (line ", Cur().line, "): ", what));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Error(absl::StrCat("expected '", op, "'"));
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) return Error("expected end of statement block");
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != T::kName) return Error("expected a name");
    std::string name = Cur().text;
    Advance();
    return name;
  }
  ExprPtr NewExpr(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = Cur().line;
    return e;
  }
  ExprPtr Binary(Expr::Kind kind, std::string name, ExprPtr a, ExprPtr b) {
    ExprPtr e = NewExpr(kind);
    e->name = std::move(name);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> ends, std::string* end);
  absl::StatusOr<NodePtr> ParseStatement();
  absl::StatusOr<NodePtr> ParseIf();
  absl::StatusOr<NodePtr> ParseFor();
  absl::StatusOr<NodePtr> ParseSet();

  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr);
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true);
  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseParenthesized();
  absl::StatusOr<ExprPtr> ParseListOrDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::Status ParseCallArgs(Expr* call);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
};

}  // namespace parser_internal
}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_PARSER_INTERNAL_H_
