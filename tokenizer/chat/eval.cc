#include "tokenizer/chat/eval.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/ops.h"

namespace tandem::tokenizer::chat {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

void SetIn(Dict* dict, const std::string& name, Value v) {
  for (auto& [k, old] : *dict) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  dict->emplace_back(name, std::move(v));
}

class Renderer {
 public:
  Renderer(const Value& context, std::string* out) : out_(out) {
    frames_.reserve(8);
    frames_.push_back(context.dict());
  }

  absl::Status Run(const Body& body) {
    Flow flow = Flow::kNormal;
    return Exec(body, &flow);
  }

 private:
  absl::Status Exec(const Body& body, Flow* flow);
  absl::Status ExecFor(const Node& node);
  absl::Status ExecSet(const Node& node);
  absl::Status BindTargets(const std::vector<std::string>& targets, const Value& item);
  Value LoopValue(const std::vector<Value>& items, size_t i) const;

  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> EvalContainer(const Expr& e);
  absl::StatusOr<Value> EvalCompare(const Expr& e);
  absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first);
  Value Lookup(const std::string& name) const;

  std::vector<Dict> frames_;
  std::string* out_;
};

absl::Status Renderer::Exec(const Body& body, Flow* flow) {
  for (const NodePtr& node : body) {
    switch (node->kind) {
      case Node::Kind::kText:
        out_->append(node->text);
        break;
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node->expr));
        AppendStr(v, out_);
        break;
      }
      case Node::Kind::kIf: {
        ASSIGN_OR_RETURN(Value cond, Eval(*node->expr));
        RETURN_IF_ERROR(Exec(cond.Truthy() ? node->body : node->else_body, flow));
        break;
      }
      case Node::Kind::kFor:
        RETURN_IF_ERROR(ExecFor(*node));
        break;
      case Node::Kind::kSet:
        RETURN_IF_ERROR(ExecSet(*node));
        break;
      case Node::Kind::kSetBlock: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        const absl::Status status = Exec(node->body, flow);
        out_ = saved;
        RETURN_IF_ERROR(status);
        SetIn(&frames_.back(), node->targets[0], Value::Str(std::move(captured)));
        break;
      }
      case Node::Kind::kBlock:
        RETURN_IF_ERROR(Exec(node->body, flow));
        break;
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
    }
    if (*flow != Flow::kNormal) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Renderer::BindTargets(const std::vector<std::string>& targets, const Value& item) {
  if (targets.size() == 1) {
    SetIn(&frames_.back(), targets[0], item);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(item));
  if (parts.size() != targets.size()) {
    return absl::InvalidArgumentError(
        parts.size() > targets.size()
            ? absl::StrCat("too many values to unpack (expected ", targets.size(), ")")
            : absl::StrCat("not enough values to unpack (expected ", targets.size(), ", got ",
                           parts.size(), ")"));
  }
  for (size_t i = 0; i < parts.size(); ++i) SetIn(&frames_.back(), targets[i], parts[i]);
  return absl::OkStatus();
}

Value Renderer::LoopValue(const std::vector<Value>& items, size_t i) const {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t index = static_cast<int64_t>(i);
  Dict loop = {
      {"index", Value::Int(index + 1)},
      {"index0", Value::Int(index)},
      {"revindex", Value::Int(n - index)},
      {"revindex0", Value::Int(n - index - 1)},
      {"first", Value::Bool(i == 0)},
      {"last", Value::Bool(index == n - 1)},
      {"length", Value::Int(n)},
      {"depth", Value::Int(1)},
      {"depth0", Value::Int(0)},
      {"previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item")},
      {"nextitem", index + 1 < n ? items[i + 1] : Value::Undefined("there is no next item")},
      {"cycle", Value::MakeCallable("loop.cycle")},
      {"changed", Value::MakeCallable("loop.changed")},
  };
  return Value::MakeDict(std::move(loop));
}

absl::Status Renderer::ExecFor(const Node& node) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
  if (node.filter != nullptr) {
    std::vector<Value> kept;
    for (Value& item : items) {
      frames_.emplace_back();
      absl::Status status = BindTargets(node.targets, item);
      absl::StatusOr<Value> cond = status.ok() ? Eval(*node.filter) : status;
      frames_.pop_back();
      if (!cond.ok()) return cond.status();
      if (cond->Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    frames_.emplace_back();
    Flow flow = Flow::kNormal;
    absl::Status status = BindTargets(node.targets, items[i]);
    if (status.ok()) {
      SetIn(&frames_.back(), "loop", LoopValue(items, i));
      status = Exec(node.body, &flow);
    }
    frames_.pop_back();
    RETURN_IF_ERROR(status);
    if (flow == Flow::kBreak) break;
  }
  if (items.empty()) {
    Flow flow = Flow::kNormal;
    RETURN_IF_ERROR(Exec(node.else_body, &flow));
  }
  return absl::OkStatus();
}

absl::Status Renderer::ExecSet(const Node& node) {
  ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
  if (node.attr.empty()) return BindTargets(node.targets, v);
  const Value ns = Lookup(node.targets[0]);
  if (!ns.is_namespace()) {
    return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
  }
  if (!node.attr.empty() && node.attr[0] == '_') {
    return absl::InvalidArgumentError(absl::StrCat(
        "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '",
        node.attr, "'. Please rename the attribute."));
  }
  SetIn(&ns.ns().attrs, node.attr, std::move(v));
  return absl::OkStatus();
}

Value Renderer::Lookup(const std::string& name) const {
  for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
    for (const auto& [k, v] : *frame) {
      if (k == name) return v;
    }
  }
  if (IsGlobalFunction(name)) return Value::MakeCallable(name);
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

absl::StatusOr<CallArgs> Renderer::EvalArgs(const Expr& e, size_t first) {
  CallArgs args;
  args.args.reserve(e.args.size() - first);
  for (size_t i = first; i < e.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.args.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.kwargs.emplace_back(key, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Renderer::EvalContainer(const Expr& e) {
  if (e.kind == Expr::Kind::kDict) {
    Dict dict;
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
      if (!key.is_string()) return absl::UnimplementedError("unsupported non-string dict key");
      ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
      SetIn(&dict, key.str(), std::move(value));
    }
    return Value::MakeDict(std::move(dict));
  }
  std::vector<Value> items;
  items.reserve(e.args.size());
  for (const ExprPtr& arg : e.args) {
    ASSIGN_OR_RETURN(Value v, Eval(*arg));
    items.push_back(std::move(v));
  }
  return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
}

absl::StatusOr<Value> Renderer::EvalCompare(const Expr& e) {
  ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
    ASSIGN_OR_RETURN(bool ok, Compare(e.ops[i], left, right));
    if (!ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Renderer::EvalCall(const Expr& e) {
  ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
  if (!callee.is_callable()) {
    const Expr& target = *e.args[0];
    if (target.kind == Expr::Kind::kName &&
        (target.name == "cycler" || target.name == "joiner" || target.name == "lipsum")) {
      return absl::UnimplementedError(absl::StrCat("unsupported Jinja global '", target.name, "'"));
    }
    if (callee.is_undefined()) return UndefinedError(callee);
    return absl::InvalidArgumentError(
        absl::StrCat("'", callee.TypeName(), "' object is not callable"));
  }
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
  return CallValue(callee.callable(), args);
}

absl::StatusOr<Value> Renderer::Eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple:
    case Expr::Kind::kDict:
      return EvalContainer(e);
    case Expr::Kind::kGetAttr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      return GetAttr(obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1] != nullptr) {
          ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1]));
        }
      }
      return Slice(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall:
      return EvalCall(e);
    case Expr::Kind::kFilter: {
      ASSIGN_OR_RETURN(Value input, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      return ApplyFilter(e.name, input, args);
    }
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value input, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, input, args));
      return Value::Bool(result);
    }
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Value::Bool(!v.Truthy());
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (e.kind == Expr::Kind::kNeg) return Negate(v);
      if (!v.is_number()) return absl::InvalidArgumentError("bad operand type for unary +");
      return v;
    }
    case Expr::Kind::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      return BinaryOp(e.name, a, b);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(e);
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kCondExpr: {
      ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
      if (cond.Truthy()) return Eval(*e.args[0]);
      if (e.args[2] != nullptr) return Eval(*e.args[2]);
      return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                           " evaluated to false and no else section was defined."));
    }
  }
  return absl::InternalError("unknown expression kind");
}

}  // namespace

absl::StatusOr<std::string> RenderBody(const Body& body, const Value& context) {
  if (!context.is_dict())
    return absl::InvalidArgumentError("chat template context must be an object");
  std::string out;
  Renderer renderer(context, &out);
  RETURN_IF_ERROR(renderer.Run(body));
  return out;
}

}  // namespace tandem::tokenizer::chat
