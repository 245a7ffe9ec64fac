// jinja2 tests, the sandbox-safe str/dict methods, and the global functions.
#include "tokenizer/chat/builtins.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "tokenizer/chat/ops.h"
#include "tokenizer/chat/py_string.h"

namespace tandem::tokenizer::chat {
namespace {

constexpr absl::string_view kStrMethods[] = {
    "strip",    "lstrip", "rstrip", "split",   "rsplit",     "splitlines", "startswith",
    "endswith", "upper",  "lower",  "title",   "capitalize", "replace",    "find",
    "rfind",    "count",  "join",   "isdigit", "isspace",    "isalpha",    "isalnum"};
constexpr absl::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr absl::string_view kUnsafeDictMethods[] = {"pop", "popitem", "setdefault", "update",
                                                    "clear"};
constexpr absl::string_view kUnsafeListMethods[] = {"append", "extend", "insert", "pop",
                                                    "remove", "clear",  "sort",   "reverse"};
constexpr absl::string_view kTests[] = {
    "defined", "undefined", "none",   "boolean",     "false",    "true",     "integer",
    "float",   "number",    "string", "mapping",     "iterable", "sequence", "callable",
    "sameas",  "equalto",   "eq",     "==",          "ne",       "!=",       "lt",
    "<",       "le",        "<=",     "gt",          ">",        "ge",       ">=",
    "in",      "odd",       "even",   "divisibleby", "lower",    "upper"};

template <size_t N>
bool In(const absl::string_view (&names)[N], absl::string_view name) {
  for (absl::string_view n : names) {
    if (n == name) return true;
  }
  return false;
}

absl::StatusOr<Value> Arg(const CallArgs& args, size_t index, absl::string_view name) {
  const Value* v = args.Get(index, name);
  if (v == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("missing argument '", name, "'"));
  return *v;
}

std::optional<std::string> OptionalStr(const CallArgs& args, size_t index, absl::string_view name) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return std::nullopt;
  return ToStr(*v);
}

Value StrList(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::Str(std::move(p)));
  return Value::MakeList(std::move(out));
}

bool AllChars(const std::string& s, bool (*pred)(uint32_t)) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (c >= 0x80) return false;  // ASCII-only classification (see README).
    if (!pred(c)) return false;
  }
  return true;
}

absl::StatusOr<bool> AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  std::vector<Value> options = affix.is_list() ? affix.items() : std::vector<Value>{affix};
  for (const Value& o : options) {
    if (!o.is_string())
      return absl::InvalidArgumentError("startswith/endswith needs str arguments");
    if (prefix ? absl::StartsWith(s, o.str()) : absl::EndsWith(s, o.str())) return true;
  }
  return false;
}

absl::StatusOr<Value> CallStrMethod(absl::string_view name, const std::string& s,
                                    const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::Str(
        PyStrip(s, OptionalStr(args, 0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* maxsplit = args.Get(1, "maxsplit");
    return StrList(PySplit(s, OptionalStr(args, 0, "sep"), maxsplit ? maxsplit->AsInt() : -1,
                           name == "rsplit"));
  }
  if (name == "splitlines") return StrList(PySplitLines(s));
  if (name == "startswith" || name == "endswith") {
    ASSIGN_OR_RETURN(Value affix, Arg(args, 0, "prefix"));
    ASSIGN_OR_RETURN(bool match, AffixMatch(s, affix, name == "startswith"));
    return Value::Bool(match);
  }
  if (name == "upper") return Value::Str(PyUpper(s));
  if (name == "lower") return Value::Str(PyLower(s));
  if (name == "title") return Value::Str(PyTitle(s));
  if (name == "capitalize") return Value::Str(PyCapitalize(s));
  if (name == "replace") {
    ASSIGN_OR_RETURN(Value old_text, Arg(args, 0, "old"));
    ASSIGN_OR_RETURN(Value new_text, Arg(args, 1, "new"));
    const Value* count = args.Get(2, "count");
    return Value::Str(PyReplace(s, ToStr(old_text), ToStr(new_text), count ? count->AsInt() : -1));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    ASSIGN_OR_RETURN(Value sub, Arg(args, 0, "sub"));
    const std::string needle = ToStr(sub);
    if (name == "count") {
      if (needle.empty()) return Value::Int(static_cast<int64_t>(CodePointLength(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(needle); at != std::string::npos;
           at = s.find(needle, at + needle.size()))
        ++n;
      return Value::Int(n);
    }
    const size_t hit = name == "find" ? s.find(needle) : s.rfind(needle);
    if (hit == std::string::npos) return Value::Int(-1);
    return Value::Int(static_cast<int64_t>(CodePointLength(absl::string_view(s).substr(0, hit))));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Value seq, Arg(args, 0, "iterable"));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(seq));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) return absl::InvalidArgumentError("str.join() expects strings");
      if (i > 0) out += s;
      out += items[i].str();
    }
    return Value::Str(std::move(out));
  }
  if (name == "isdigit")
    return Value::Bool(AllChars(s, [](uint32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isspace") return Value::Bool(AllChars(s, IsPySpace));
  if (name == "isalpha") {
    return Value::Bool(
        AllChars(s, [](uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }));
  }
  return Value::Bool(AllChars(s, [](uint32_t c) {  // isalnum
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  }));
}

absl::StatusOr<Value> CallDictMethod(absl::string_view name, const Dict& dict,
                                     const CallArgs& args) {
  std::vector<Value> out;
  if (name == "get") {
    ASSIGN_OR_RETURN(Value key, Arg(args, 0, "key"));
    const Value* dflt = args.Get(1, "default");
    if (key.is_string()) {
      for (const auto& [k, v] : dict) {
        if (k == key.str()) return v;
      }
    }
    return dflt != nullptr ? *dflt : Value::None();
  }
  for (const auto& [k, v] : dict) {
    if (name == "items") {
      out.push_back(Value::MakeList({Value::Str(k), v}, true));
    } else {
      out.push_back(name == "keys" ? Value::Str(k) : v);
    }
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<bool> SameAs(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_list() || a.is_dict()) return &a.items() == &b.items();  // Identity.
  return Equals(a, b);
}

absl::StatusOr<Value> MakeNamespaceValue(const CallArgs& args, bool is_dict) {
  Dict attrs;
  auto set = [&attrs](const std::string& key, const Value& v) {
    for (auto& [k, old] : attrs) {
      if (k == key) {
        old = v;
        return;
      }
    }
    attrs.emplace_back(key, v);
  };
  for (const Value& a : args.args) {
    if (!a.is_dict())
      return absl::InvalidArgumentError("namespace() positional argument must be a dict");
    for (const auto& [k, v] : a.dict()) set(k, v);
  }
  for (const auto& [k, v] : args.kwargs) set(k, v);
  for (const auto& [k, v] : attrs) {
    if (!is_dict && absl::StartsWith(k, "_")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '", k,
          "'. Please rename the attribute."));
    }
  }
  return Value::MakeNamespace(std::move(attrs));
}

absl::StatusOr<Value> Range(const CallArgs& args) {
  if (args.args.empty() || args.args.size() > 3)
    return absl::InvalidArgumentError("range() takes 1 to 3 arguments");
  for (const Value& a : args.args) {
    if (!a.is_int() && !a.is_bool())
      return absl::InvalidArgumentError("range() arguments must be integers");
  }
  int64_t start = 0, stop = 0, step = 1;
  if (args.args.size() == 1) {
    stop = args.args[0].AsInt();
  } else {
    start = args.args[0].AsInt();
    stop = args.args[1].AsInt();
    if (args.args.size() == 3) step = args.args[2].AsInt();
  }
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) {
      return absl::InvalidArgumentError(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::Int(i));
  }
  return Value::MakeList(std::move(out));
}

}  // namespace

const Value* CallArgs::Get(size_t index, absl::string_view name) const {
  if (index < args.size()) return &args[index];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool IsSupportedTest(absl::string_view name) { return In(kTests, name); }

bool IsGlobalFunction(absl::string_view name) {
  return name == "raise_exception" || name == "strftime_now" || name == "namespace" ||
         name == "dict" || name == "range";
}

absl::StatusOr<bool> IsMethod(const Value& obj, absl::string_view name) {
  if (obj.is_string()) return In(kStrMethods, name);
  const bool dict = obj.is_dict();
  if ((dict && In(kUnsafeDictMethods, name)) || (obj.is_list() && In(kUnsafeListMethods, name))) {
    return absl::PermissionDeniedError(absl::StrCat("access to attribute '", name, "' of '",
                                                    obj.TypeName(), "' object is unsafe."));
  }
  return dict && In(kDictMethods, name);
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, unused] : v.dict()) keys.push_back(Value::Str(k));
      return keys;
    }
    case Value::Kind::kString: {
      const std::vector<size_t> offsets = CodePointOffsets(v.str());
      std::vector<Value> chars;
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(Value::Str(v.str().substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable" || name == "sequence") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "callable") return v.is_callable();
  if (name == "lower" || name == "upper") {
    const std::string s = ToStr(v);
    const std::string mapped = name == "lower" ? PyLower(s) : PyUpper(s);
    return mapped == s && (name == "lower" ? PyUpper(s) : PyLower(s)) != s;
  }
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool())
      return absl::InvalidArgumentError("odd/even test needs an integer");
    return (v.AsInt() % 2 != 0) == (name == "odd");
  }
  ASSIGN_OR_RETURN(Value other, Arg(args, 0, "other"));
  if (name == "sameas") return SameAs(v, other);
  if (name == "divisibleby") {
    if (!v.is_number() || !other.is_number() || other.AsDouble() == 0) {
      return absl::InvalidArgumentError("divisibleby needs non-zero numbers");
    }
    ASSIGN_OR_RETURN(Value mod, BinaryOp("%", v, other));
    return mod.AsDouble() == 0;
  }
  static constexpr std::pair<absl::string_view, absl::string_view> kCompare[] = {
      {"equalto", "=="}, {"eq", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="},
      {"lt", "<"},       {"<", "<"},   {"le", "<="}, {"<=", "<="}, {"gt", ">"},
      {">", ">"},        {"ge", ">="}, {">=", ">="}, {"in", "in"}};
  for (const auto& [test, op] : kCompare) {
    if (test == name) return Compare(op, v, other);
  }
  return absl::UnimplementedError(absl::StrCat("unsupported Jinja test '", name, "'"));
}

absl::StatusOr<Value> CallValue(const Callable& callable, const CallArgs& args) {
  if (callable.self == nullptr) return CallGlobal(callable.name, args);
  const Value& self = *callable.self;
  if (self.is_string()) return CallStrMethod(callable.name, self.str(), args);
  if (self.is_dict()) return CallDictMethod(callable.name, self.dict(), args);
  return absl::UnimplementedError(absl::StrCat("unsupported method '", callable.name, "'"));
}

absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& args) {
  if (name == "raise_exception") {
    ASSIGN_OR_RETURN(Value message, Arg(args, 0, "message"));
    return absl::InvalidArgumentError(ToStr(message));
  }
  if (name == "strftime_now") {
    ASSIGN_OR_RETURN(Value format, Arg(args, 0, "format"));
    return Value::Str(absl::FormatTime(ToStr(format), absl::Now(), absl::LocalTimeZone()));
  }
  if (name == "namespace") return MakeNamespaceValue(args, /*is_dict=*/false);
  if (name == "dict") {
    ASSIGN_OR_RETURN(Value ns, MakeNamespaceValue(args, /*is_dict=*/true));
    return Value::MakeDict(ns.ns().attrs);
  }
  if (name == "range") return Range(args);
  return absl::UnimplementedError(absl::StrCat("unsupported Jinja global '", name, "'"));
}

}  // namespace tandem::tokenizer::chat
