// Expression parsing of the chat-template parser: jinja2's grammar and precedence (conditional
// expressions, or/and/not, comparisons, + -, ~, * / // %, **, unary, postfix, filters, tests).
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/parser_internal.h"

namespace tandem::tokenizer::chat {
namespace parser_internal {

absl::StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr) {
  ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_condexpr));
  if (!IsOp(",")) return first;
  ExprPtr tuple = NewExpr(Expr::Kind::kTuple);
  tuple->args.push_back(std::move(first));
  while (IsOp(",")) {
    Advance();
    if (Cur().type == T::kVarEnd || Cur().type == T::kBlockEnd || IsName("if")) break;
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
    tuple->args.push_back(std::move(item));
  }
  return tuple;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  return with_condexpr ? ParseCondExpr() : ParseOr();
}

absl::StatusOr<ExprPtr> Parser::ParseCondExpr() {
  ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    Advance();
    ExprPtr cond = NewExpr(Expr::Kind::kCondExpr);
    cond->args.push_back(std::move(expr));
    ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    cond->args.push_back(std::move(test));
    ExprPtr otherwise;
    if (IsName("else")) {
      Advance();
      ASSIGN_OR_RETURN(otherwise, ParseCondExpr());
    }
    cond->args.push_back(std::move(otherwise));
    expr = std::move(cond);
  }
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName("or")) {
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    left = Binary(Expr::Kind::kOr, "or", std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName("and")) {
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    left = Binary(Expr::Kind::kAnd, "and", std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (!IsName("not")) return ParseCompare();
  ExprPtr node = NewExpr(Expr::Kind::kNot);
  Advance();
  ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
  node->args.push_back(std::move(operand));
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (Cur().type == T::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                 Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      Advance();
    } else if (IsName("in")) {
      op = "in";
      Advance();
    } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
      op = "notin";
      pos_ += 2;
    } else {
      break;
    }
    if (cmp == nullptr) {
      cmp = NewExpr(Expr::Kind::kCompare);
      cmp->args.push_back(std::move(first));
    }
    ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    cmp->ops.push_back(std::move(op));
    cmp->args.push_back(std::move(operand));
  }
  return cmp != nullptr ? std::move(cmp) : std::move(first);
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    std::string op = Cur().text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
    left = Binary(Expr::Kind::kBinary, std::move(op), std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
  while (IsOp("~")) {
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
    left = Binary(Expr::Kind::kBinary, "~", std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    std::string op = Cur().text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
    left = Binary(Expr::Kind::kBinary, std::move(op), std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
  while (IsOp("**")) {
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
    left = Binary(Expr::Kind::kBinary, "**", std::move(left), std::move(right));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    node = NewExpr(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
    Advance();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    node->args.push_back(std::move(operand));
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) return ParseFilterExpr(std::move(node));
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token& tok = Cur();
  ExprPtr node = NewExpr(Expr::Kind::kLiteral);
  switch (tok.type) {
    case T::kName:
      if (tok.text == "true" || tok.text == "True") {
        node->literal = Value::Bool(true);
      } else if (tok.text == "false" || tok.text == "False") {
        node->literal = Value::Bool(false);
      } else if (tok.text == "none" || tok.text == "None") {
        node->literal = Value::None();
      } else {
        node->kind = Expr::Kind::kName;
        node->name = tok.text;
      }
      Advance();
      return node;
    case T::kString: {
      std::string text;
      while (Cur().type == T::kString) {  // Adjacent literals concatenate.
        text += Cur().text;
        Advance();
      }
      node->literal = Value::Str(std::move(text));
      return node;
    }
    case T::kInt:
      node->literal = Value::Int(tok.int_value);
      Advance();
      return node;
    case T::kFloat:
      node->literal = Value::Float(tok.float_value);
      Advance();
      return node;
    case T::kOp:
      if (tok.text == "(") return ParseParenthesized();
      if (tok.text == "[" || tok.text == "{") return ParseListOrDict();
      break;
    default:
      break;
  }
  return Error("unexpected token in expression");
}

absl::StatusOr<ExprPtr> Parser::ParseParenthesized() {
  Advance();  // (
  if (IsOp(")")) {
    Advance();
    ExprPtr empty = NewExpr(Expr::Kind::kTuple);
    return empty;
  }
  ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
  if (IsOp(")")) {
    Advance();
    return first;
  }
  ExprPtr tuple = NewExpr(Expr::Kind::kTuple);
  tuple->args.push_back(std::move(first));
  while (IsOp(",")) {
    Advance();
    if (IsOp(")")) break;
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
    tuple->args.push_back(std::move(item));
  }
  RETURN_IF_ERROR(ExpectOp(")"));
  return tuple;
}

absl::StatusOr<ExprPtr> Parser::ParseListOrDict() {
  const bool is_list = IsOp("[");
  ExprPtr node = NewExpr(is_list ? Expr::Kind::kList : Expr::Kind::kDict);
  Advance();
  const absl::string_view close = is_list ? "]" : "}";
  while (!IsOp(close)) {
    if (is_list) {
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      node->args.push_back(std::move(item));
    } else {
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      node->args.push_back(std::move(key));
      node->args.push_back(std::move(value));
    }
    if (!IsOp(",")) break;
    Advance();
  }
  RETURN_IF_ERROR(ExpectOp(close));
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(".")) {
      Advance();
      if (Cur().type == T::kInt) {
        ExprPtr index = NewExpr(Expr::Kind::kLiteral);
        index->literal = Value::Int(Cur().int_value);
        Advance();
        node = Binary(Expr::Kind::kGetItem, "", std::move(node), std::move(index));
        continue;
      }
      ExprPtr attr = NewExpr(Expr::Kind::kGetAttr);
      ASSIGN_OR_RETURN(attr->name, ExpectName());
      attr->args.push_back(std::move(node));
      node = std::move(attr);
    } else if (IsOp("[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (IsOp("(")) {
      ExprPtr call = NewExpr(Expr::Kind::kCall);
      call->args.push_back(std::move(node));
      RETURN_IF_ERROR(ParseCallArgs(call.get()));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  Advance();  // [
  ExprPtr parts[3];
  if (!IsOp(":")) {
    ASSIGN_OR_RETURN(parts[0], ParseExpression());
    if (IsOp("]")) {
      Advance();
      return Binary(Expr::Kind::kGetItem, "", std::move(node), std::move(parts[0]));
    }
  }
  for (int i = 1; i < 3 && IsOp(":"); ++i) {
    Advance();
    if (!IsOp("]") && !IsOp(":")) {
      ASSIGN_OR_RETURN(parts[i], ParseExpression());
    }
  }
  RETURN_IF_ERROR(ExpectOp("]"));
  ExprPtr slice = NewExpr(Expr::Kind::kSlice);
  slice->args.push_back(std::move(node));
  for (ExprPtr& part : parts) slice->args.push_back(std::move(part));
  return slice;
}

absl::Status Parser::ParseCallArgs(Expr* call) {
  Advance();  // (
  while (!IsOp(")")) {
    if (IsOp("*") || IsOp("**"))
      return absl::UnimplementedError("unsupported Jinja construct: *args/**kwargs in a call");
    if (Cur().type == T::kName && Peek().type == T::kOp && Peek().text == "=") {
      std::string key = Cur().text;
      pos_ += 2;
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call->kwargs.empty()) return Error("positional argument follows keyword argument");
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->args.push_back(std::move(value));
    }
    if (!IsOp(",")) break;
    Advance();
  }
  return ExpectOp(")");
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp("|")) {
      Advance();
      ExprPtr filter = NewExpr(Expr::Kind::kFilter);
      ASSIGN_OR_RETURN(filter->name, ExpectName());
      if (!IsSupportedFilter(filter->name)) {
        return absl::UnimplementedError(
            absl::StrCat("unsupported Jinja filter '", filter->name, "'"));
      }
      filter->args.push_back(std::move(node));
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(filter.get()));
      node = std::move(filter);
    } else if (IsName("is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr node) {
  Advance();  // is
  bool negated = false;
  if (IsName("not")) {
    negated = true;
    Advance();
  }
  ExprPtr test = NewExpr(Expr::Kind::kTest);
  ASSIGN_OR_RETURN(test->name, ExpectName());
  if (!IsSupportedTest(test->name)) {
    return absl::UnimplementedError(absl::StrCat("unsupported Jinja test '", test->name, "'"));
  }
  test->args.push_back(std::move(node));
  if (IsOp("(")) {
    RETURN_IF_ERROR(ParseCallArgs(test.get()));
  } else if ((Cur().type == T::kName && !IsName("else") && !IsName("or") && !IsName("and") &&
              !IsName("is")) ||
             Cur().type == T::kString || Cur().type == T::kInt || Cur().type == T::kFloat ||
             IsOp("(") || IsOp("[") || IsOp("{")) {
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    test->args.push_back(std::move(arg));
  }
  if (!negated) return test;
  ExprPtr neg = NewExpr(Expr::Kind::kNot);
  neg->args.push_back(std::move(test));
  return neg;
}

}  // namespace parser_internal
}  // namespace tandem::tokenizer::chat
