// The parsed form of a chat template: expression and statement trees the evaluator walks.
//
// Thread safety: immutable after parsing; shared by concurrent renders.
#ifndef TANDEM_TOKENIZER_CHAT_AST_H_
#define TANDEM_TOKENIZER_CHAT_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat/value.h"

namespace tandem::tokenizer::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // kwargs: key/value pairs (keys are string literals)
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null parts absent)
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0] | name(args[1:], kwargs)
    kTest,      // args[0] is name(args[1:])
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1]; name in + - * / // % ** ~
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...; ops in == != < <= > >= in notin
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // if expr: body else else_body (elif nests an kIf in else_body)
    kFor,       // for targets in expr [if filter]: body [else else_body]
    kSet,       // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %} body {% endset
    kBreak,
    kContinue,
    kBlock,  // body rendered as is ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  Body body;
  Body else_body;
};

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_AST_H_
