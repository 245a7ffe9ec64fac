#include "tokenizer/chat/ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/py_string.h"

namespace tandem::tokenizer::chat {
namespace {

// jinja2's object_type_repr: "None", "dict object", ...
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return absl::StrCat(v.TypeName(), " object");
}

std::string PyRepr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

Value MissingAttr(const Value& obj, absl::string_view name) {
  std::string hint = ObjectTypeRepr(obj);
  if (!obj.is_none()) hint = absl::StrCat("'", hint, "'");
  return Value::Undefined(absl::StrCat(hint, " has no attribute ", PyRepr(Value::Str(name))));
}

Value MissingElement(const Value& obj, const Value& key) {
  return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element ", PyRepr(key)));
}

absl::Status TypeError(absl::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

// Python's slice.indices() followed by the selection, on `n` elements.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop, int64_t step) {
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_undefined() || v.is_none()) return dflt;
    int64_t i = v.AsInt();
    if (i < 0) i += n;
    if (step > 0) return std::min(std::max<int64_t>(i, 0), n);
    return std::min(std::max<int64_t>(i, -1), n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(i);
  return out;
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t FloorMod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

absl::StatusOr<Value> Arithmetic(absl::string_view op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (b.AsDouble() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.AsDouble() / b.AsDouble());
  }
  if (op == "//" || op == "%") {
    if (b.AsDouble() == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (ints) {
      return Value::Int(op == "//" ? FloorDiv(a.AsInt(), b.AsInt())
                                   : FloorMod(a.AsInt(), b.AsInt()));
    }
    const double x = a.AsDouble(), y = b.AsDouble();
    const double q = std::floor(x / y);
    return Value::Float(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (ints && b.AsInt() >= 0) {
      int64_t result = 1;
      for (int64_t i = 0; i < b.AsInt(); ++i) {
        if (__builtin_mul_overflow(result, a.AsInt(), &result)) {
          return absl::UnimplementedError("integer overflow (Python ints are unbounded)");
        }
      }
      return Value::Int(result);
    }
    return Value::Float(std::pow(a.AsDouble(), b.AsDouble()));
  }
  if (ints) {
    int64_t result = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(a.AsInt(), b.AsInt(), &result);
    if (op == "-") overflow = __builtin_sub_overflow(a.AsInt(), b.AsInt(), &result);
    if (op == "*") overflow = __builtin_mul_overflow(a.AsInt(), b.AsInt(), &result);
    if (overflow) return absl::UnimplementedError("integer overflow (Python ints are unbounded)");
    return Value::Int(result);
  }
  const double x = a.AsDouble(), y = b.AsDouble();
  return Value::Float(op == "+" ? x + y : op == "-" ? x - y : x * y);
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::Str(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::MakeList(std::move(out), seq.list().is_tuple);
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.Find(item.str()) != nullptr;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<int> Order(absl::string_view op, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.AsDouble(), y = b.AsDouble();
    if (!a.is_float() && !b.is_float()) return a.AsInt() < b.AsInt() ? -1 : a.AsInt() > b.AsInt();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() > b.str();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Order(op, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return absl::InvalidArgumentError(absl::StrCat("'", op, "' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  const std::string& hint = undefined.undefined_hint();
  return absl::InvalidArgumentError(hint.empty() ? "value is undefined" : hint);
}

absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kNamespace:
      for (const auto& [k, v] : obj.ns().attrs) {
        if (k == name) return v;
      }
      return MissingAttr(obj, name);
    case Value::Kind::kDict:
    case Value::Kind::kString:
    case Value::Kind::kList: {
      ASSIGN_OR_RETURN(bool is_method, IsMethod(obj, name));
      if (is_method) return Value::MakeCallable(std::string(name), obj);
      if (obj.is_dict()) {
        if (const Value* v = obj.Find(name)) return *v;
      }
      return MissingAttr(obj, name);
    }
    default:
      return MissingAttr(obj, name);
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.Find(key.str())) return *v;
      return GetAttr(obj, key.str());
    }
    return MissingElement(obj, key);
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.AsInt();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return MissingElement(obj, key);
      return obj.items()[i];
    }
    const std::vector<size_t> offsets = CodePointOffsets(obj.str());
    const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return MissingElement(obj, key);
    return Value::Str(obj.str().substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return MissingElement(obj, key);
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  for (const Value* part : {&start, &stop, &step}) {
    if (!part->is_undefined() && !part->is_none() && !part->is_int() && !part->is_bool()) {
      return absl::InvalidArgumentError(
          "slice indices must be integers or None or have an __index__ method");
    }
  }
  const int64_t s = (step.is_undefined() || step.is_none()) ? 1 : step.AsInt();
  if (s == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (obj.is_list()) {
    std::vector<Value> out;
    for (int64_t i : SliceIndices(obj.items().size(), start, stop, s))
      out.push_back(obj.items()[i]);
    return Value::MakeList(std::move(out), obj.list().is_tuple);
  }
  if (obj.is_string()) {
    const std::vector<size_t> offsets = CodePointOffsets(obj.str());
    std::string out;
    for (int64_t i : SliceIndices(offsets.size() - 1, start, stop, s)) {
      out.append(obj.str(), offsets[i], offsets[i + 1] - offsets[i]);
    }
    return Value::Str(std::move(out));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
}

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string out = ToStr(a);
    AppendStr(b, &out);
    return Value::Str(std::move(out));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) return Arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::Str(a.str() + b.str());
    if (a.is_list() && b.is_list() && a.list().is_tuple == b.list().is_tuple) {
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::MakeList(std::move(out), a.list().is_tuple);
    }
    if (a.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("can only concatenate str (not \"", b.TypeName(), "\") to str"));
    }
    if (a.is_list()) {
      return absl::InvalidArgumentError(absl::StrCat("can only concatenate ", a.TypeName(),
                                                     " (not \"", b.TypeName(), "\") to ",
                                                     a.TypeName()));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return Repeat(a, b.AsInt());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return Repeat(b, a.AsInt());
  }
  if (op == "%" && a.is_string()) {
    return absl::UnimplementedError(
        "unsupported Jinja construct: printf-style string formatting ('%')");
  }
  return TypeError(op, a, b);
}

absl::StatusOr<Value> Negate(const Value& v) {
  if (v.is_float()) return Value::Float(-v.float_value());
  if (v.is_int() || v.is_bool()) return Value::Int(-v.AsInt());
  if (v.is_undefined()) return UndefinedError(v);
  return absl::InvalidArgumentError(
      absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
}

absl::StatusOr<bool> Compare(absl::string_view op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") {
    ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return !in;
  }
  ASSIGN_OR_RETURN(int order, Order(op, a, b));
  if (op == "<") return order < 0;
  if (op == "<=") return order <= 0;
  if (op == ">") return order > 0;
  return order >= 0;
}

}  // namespace tandem::tokenizer::chat
