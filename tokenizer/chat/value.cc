#include "tokenizer/chat/value.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/py_string.h"

namespace tandem::tokenizer::chat {

Value Value::Undefined(std::string hint) {
  Value v;
  v.v_ = UndefinedData{std::move(hint)};
  return v;
}

Value Value::MakeList(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.v_ = std::make_shared<const List>(List{std::move(items), is_tuple});
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v;
  v.v_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::MakeNamespace(Dict attrs) {
  Value v;
  v.v_ = std::make_shared<Namespace>(Namespace{std::move(attrs)});
  return v;
}

Value Value::MakeCallable(std::string name, std::optional<Value> self) {
  Value v;
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  if (self) c->self = std::make_shared<const Value>(std::move(*self));
  v.v_ = std::shared_ptr<const Callable>(std::move(c));
  return v;
}

const Value* Value::Find(absl::string_view key) const {
  for (const auto& [k, v] : dict()) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_value();
    case Kind::kInt:
      return int_value() != 0;
    case Kind::kFloat:
      return float_value() != 0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !items().empty();
    case Kind::kDict:
      return !dict().empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return list().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "builtin_function_or_method";
  }
  return "object";
}

bool Equals(const Value& a, const Value& b) {
  using Kind = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    return a.AsInt() == b.AsInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      if (a.list().is_tuple != b.list().is_tuple || a.items().size() != b.items().size()) {
        return false;
      }
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!Equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.ns() == &b.ns();
    case Kind::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

namespace {

void AppendDictRepr(const Dict& dict, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : dict) {
    if (!first) out->append(", ");
    first = false;
    AppendPyStrRepr(k, out);
    out->append(": ");
    AppendRepr(v, out);
  }
  out->push_back('}');
}

}  // namespace

void AppendRepr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      out->append("Undefined");
      return;
    case Value::Kind::kString:
      AppendPyStrRepr(v.str(), out);
      return;
    case Value::Kind::kList: {
      const bool tuple = v.list().is_tuple;
      out->push_back(tuple ? '(' : '[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out->append(", ");
        AppendRepr(v.items()[i], out);
      }
      if (tuple && v.items().size() == 1) out->push_back(',');
      out->push_back(tuple ? ')' : ']');
      return;
    }
    case Value::Kind::kDict:
      AppendDictRepr(v.dict(), out);
      return;
    default:
      AppendStr(v, out);
  }
}

void AppendStr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kNone:
      out->append("None");
      return;
    case Value::Kind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return;
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return;
    case Value::Kind::kFloat:
      out->append(PyFloatRepr(v.float_value()));
      return;
    case Value::Kind::kString:
      out->append(v.str());
      return;
    case Value::Kind::kNamespace:
      out->append("<Namespace ");
      AppendDictRepr(v.ns().attrs, out);
      out->append(">");
      return;
    case Value::Kind::kCallable:
      absl::StrAppend(out, "<built-in function ", v.callable().name, ">");
      return;
    default:
      AppendRepr(v, out);
  }
}

std::string ToStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  AppendStr(v, &out);
  return out;
}

namespace {

absl::Status AppendJson(const Value& v, const JsonOptions& options, int depth, std::string* out);

void AppendNewline(const JsonOptions& options, int depth, std::string* out) {
  out->push_back('\n');
  for (int i = 0; i < depth; ++i) out->append(*options.indent);
}

absl::Status AppendJsonContainer(const Value& v, const JsonOptions& options, int depth,
                                 std::string* out) {
  const bool is_list = v.is_list();
  const size_t size = is_list ? v.items().size() : v.dict().size();
  if (size == 0) {
    out->append(is_list ? "[]" : "{}");
    return absl::OkStatus();
  }
  std::vector<size_t> order(size);
  for (size_t i = 0; i < size; ++i) order[i] = i;
  if (!is_list && options.sort_keys) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return v.dict()[a].first < v.dict()[b].first; });
  }
  out->push_back(is_list ? '[' : '{');
  const bool pretty = options.indent.has_value();
  for (size_t i = 0; i < size; ++i) {
    if (i > 0) out->append(options.item_separator);
    if (pretty) AppendNewline(options, depth + 1, out);
    if (is_list) {
      RETURN_IF_ERROR(AppendJson(v.items()[i], options, depth + 1, out));
    } else {
      const auto& [key, item] = v.dict()[order[i]];
      AppendJsonString(key, options.ensure_ascii, out);
      out->append(options.key_separator);
      RETURN_IF_ERROR(AppendJson(item, options, depth + 1, out));
    }
  }
  if (pretty) AppendNewline(options, depth, out);
  out->push_back(is_list ? ']' : '}');
  return absl::OkStatus();
}

absl::Status AppendJson(const Value& v, const JsonOptions& options, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: value nested too deeply");
  switch (v.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.bool_value() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.float_value();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(PyFloatRepr(d));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.str(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return AppendJsonContainer(v, options, depth, out);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  RETURN_IF_ERROR(AppendJson(v, options, 0, &out));
  return out;
}

}  // namespace tandem::tokenizer::chat
