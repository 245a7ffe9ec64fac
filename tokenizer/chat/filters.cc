// jinja2's builtin filters used by chat templates, and transformers' `tojson`.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/ops.h"
#include "tokenizer/chat/py_string.h"

namespace tandem::tokenizer::chat {
namespace {

using FilterFn = absl::StatusOr<Value> (*)(const Value& input, const CallArgs& args);

Value ArgOr(const CallArgs& args, size_t index, absl::string_view name, Value dflt) {
  const Value* v = args.Get(index, name);
  return v != nullptr ? *v : dflt;
}

absl::StatusOr<Value> Trim(const Value& in, const CallArgs& args) {
  const Value chars = ArgOr(args, 0, "chars", Value::None());
  std::optional<std::string> set;
  if (chars.is_string()) set = chars.str();
  return Value::Str(PyStrip(ToStr(in), set, true, true));
}

absl::StatusOr<Value> ToJsonFilter(const Value& in, const CallArgs& args) {
  JsonOptions options;
  options.ensure_ascii = ArgOr(args, 0, "ensure_ascii", Value::Bool(false)).Truthy();
  const Value indent = ArgOr(args, 1, "indent", Value::None());
  if (indent.is_int() || indent.is_bool()) {
    const int64_t width = std::clamp<int64_t>(indent.AsInt(), 0, 4096);
    options.indent.emplace();
    for (int64_t i = 0; i < width; ++i) options.indent->push_back(' ');
  } else if (indent.is_string()) {
    options.indent = indent.str();
  } else if (!indent.is_none()) {
    return absl::UnimplementedError("unsupported tojson indent type");
  }
  if (options.indent)
    options.item_separator.resize(1);  // ", " -> "," (assigning a literal trips GCC 12 -Wrestrict).
  const Value separators = ArgOr(args, 2, "separators", Value::None());
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.items().size() != 2 ||
        !separators.items()[0].is_string() || !separators.items()[1].is_string()) {
      return absl::InvalidArgumentError("tojson separators must be a pair of strings");
    }
    options.item_separator = separators.items()[0].str();
    options.key_separator = separators.items()[1].str();
  }
  options.sort_keys = ArgOr(args, 3, "sort_keys", Value::Bool(false)).Truthy();
  ASSIGN_OR_RETURN(std::string json, ToJson(in, options));
  return Value::Str(std::move(json));
}

absl::StatusOr<Value> Length(const Value& in, const CallArgs&) {
  switch (in.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointLength(in.str())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(in.items().size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(in.dict().size()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("object of type '", in.TypeName(), "' has no len()"));
  }
}

// jinja2's make_attrgetter: dotted path, integer parts index.
absl::StatusOr<Value> GetPath(const Value& item, absl::string_view path) {
  Value v = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index = 0;
    if (absl::SimpleAtoi(part, &index)) {
      ASSIGN_OR_RETURN(v, GetItem(v, Value::Int(index)));
    } else {
      ASSIGN_OR_RETURN(v, GetItem(v, Value::Str(part)));
    }
  }
  return v;
}

absl::StatusOr<Value> Join(const Value& in, const CallArgs& args) {
  const Value sep = ArgOr(args, 0, "d", Value::Str(""));
  const Value* attribute = args.Get(1, "attribute");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) AppendStr(sep, &out);
    if (attribute != nullptr && !attribute->is_none()) {
      ASSIGN_OR_RETURN(Value v, GetPath(items[i], ToStr(*attribute)));
      AppendStr(v, &out);
    } else {
      AppendStr(items[i], &out);
    }
  }
  return Value::Str(std::move(out));
}

absl::StatusOr<Value> Upper(const Value& in, const CallArgs&) {
  return Value::Str(PyUpper(ToStr(in)));
}
absl::StatusOr<Value> Lower(const Value& in, const CallArgs&) {
  return Value::Str(PyLower(ToStr(in)));
}
absl::StatusOr<Value> Capitalize(const Value& in, const CallArgs&) {
  return Value::Str(PyCapitalize(ToStr(in)));
}
absl::StatusOr<Value> Title(const Value& in, const CallArgs&) {
  return Value::Str(JinjaTitle(ToStr(in)));
}
absl::StatusOr<Value> String(const Value& in, const CallArgs&) { return Value::Str(ToStr(in)); }
absl::StatusOr<Value> Safe(const Value& in, const CallArgs&) { return in; }

absl::StatusOr<Value> Default(const Value& in, const CallArgs& args) {
  const Value dflt = ArgOr(args, 0, "default_value", Value::Str(""));
  const bool boolean = ArgOr(args, 1, "boolean", Value::Bool(false)).Truthy();
  if (in.is_undefined() || (boolean && !in.Truthy())) return dflt;
  return in;
}

absl::StatusOr<Value> First(const Value& in, const CallArgs&) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> Last(const Value& in, const CallArgs&) {
  if (in.is_undefined()) return UndefinedError(in);
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

absl::StatusOr<Value> ListFilter(const Value& in, const CallArgs&) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> Replace(const Value& in, const CallArgs& args) {
  const Value* old_text = args.Get(0, "old");
  const Value* new_text = args.Get(1, "new");
  if (old_text == nullptr || new_text == nullptr) {
    return absl::InvalidArgumentError("replace() needs 'old' and 'new'");
  }
  const Value count = ArgOr(args, 2, "count", Value::None());
  return Value::Str(PyReplace(ToStr(in), ToStr(*old_text), ToStr(*new_text),
                              count.is_none() ? -1 : count.AsInt()));
}

absl::StatusOr<Value> Items(const Value& in, const CallArgs&) {
  if (in.is_undefined()) return Value::MakeList({});
  if (!in.is_dict()) return absl::InvalidArgumentError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, v] : in.dict()) out.push_back(Value::MakeList({Value::Str(k), v}, true));
  return Value::MakeList(std::move(out));
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& in, const CallArgs& args, bool with_attr,
                                     bool select) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  size_t next = 0;
  std::string attr;
  if (with_attr) {
    if (args.args.empty()) return absl::InvalidArgumentError("selectattr needs an attribute");
    attr = ToStr(args.args[next++]);
  }
  std::string test;
  CallArgs test_args;
  if (next < args.args.size()) {
    test = ToStr(args.args[next++]);
    if (!IsSupportedTest(test)) {
      return absl::UnimplementedError(absl::StrCat("unsupported Jinja test '", test, "'"));
    }
    test_args.args.assign(args.args.begin() + next, args.args.end());
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (with_attr) {
      ASSIGN_OR_RETURN(subject, GetPath(item, attr));
    }
    bool passed = subject.Truthy();
    if (!test.empty()) {
      ASSIGN_OR_RETURN(passed, ApplyTest(test, subject, test_args));
    }
    if (passed == select) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Select(const Value& in, const CallArgs& a) {
  return SelectOrReject(in, a, false, true);
}
absl::StatusOr<Value> Reject(const Value& in, const CallArgs& a) {
  return SelectOrReject(in, a, false, false);
}
absl::StatusOr<Value> SelectAttr(const Value& in, const CallArgs& a) {
  return SelectOrReject(in, a, true, true);
}
absl::StatusOr<Value> RejectAttr(const Value& in, const CallArgs& a) {
  return SelectOrReject(in, a, true, false);
}

absl::StatusOr<Value> Map(const Value& in, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  std::vector<Value> out;
  if (const Value* attribute = args.Get(99, "attribute"); attribute != nullptr) {
    const Value* dflt = args.Get(99, "default");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, GetPath(item, ToStr(*attribute)));
      out.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
    }
    return Value::MakeList(std::move(out));
  }
  if (args.args.empty()) return absl::InvalidArgumentError("map() needs a filter or attribute");
  const std::string filter = ToStr(args.args[0]);
  if (!IsSupportedFilter(filter)) {
    return absl::UnimplementedError(absl::StrCat("unsupported Jinja filter '", filter, "'"));
  }
  CallArgs filter_args;
  filter_args.args.assign(args.args.begin() + 1, args.args.end());
  filter_args.kwargs = args.kwargs;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, filter_args));
    out.push_back(std::move(v));
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Int(const Value& in, const CallArgs& args) {
  const Value dflt = ArgOr(args, 0, "default", Value::Int(0));
  const Value base = ArgOr(args, 1, "base", Value::Int(10));
  if (in.is_int() || in.is_bool()) return Value::Int(in.AsInt());
  if (in.is_float()) return Value::Int(static_cast<int64_t>(in.float_value()));
  if (!in.is_string()) return dflt;
  const std::string text = PyStrip(in.str(), std::nullopt, true, true);
  std::string digits;
  for (char c : text) {
    if (c != '_') digits.push_back(c);
  }
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base.AsInt()));
  if (!digits.empty() && end != nullptr && *end == '\0') return Value::Int(v);
  double d = 0;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d)) return Value::Int(static_cast<int64_t>(d));
  return dflt;
}

absl::StatusOr<Value> Float(const Value& in, const CallArgs& args) {
  const Value dflt = ArgOr(args, 0, "default", Value::Float(0.0));
  if (in.is_number()) return Value::Float(in.AsDouble());
  double d = 0;
  if (in.is_string() && absl::SimpleAtod(PyStrip(in.str(), std::nullopt, true, true), &d)) {
    return Value::Float(d);
  }
  return dflt;
}

absl::StatusOr<Value> Abs(const Value& in, const CallArgs&) {
  if (in.is_float()) return Value::Float(std::abs(in.float_value()));
  if (in.is_int() || in.is_bool()) return Value::Int(std::abs(in.AsInt()));
  return absl::InvalidArgumentError(
      absl::StrCat("bad operand type for abs(): '", in.TypeName(), "'"));
}

absl::StatusOr<Value> Reverse(const Value& in, const CallArgs&) {
  if (in.is_string()) {
    const std::vector<size_t> offsets = CodePointOffsets(in.str());
    std::string out;
    for (size_t i = offsets.size() - 1; i > 0; --i) {
      out.append(in.str(), offsets[i - 1], offsets[i] - offsets[i - 1]);
    }
    return Value::Str(std::move(out));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> Escape(const Value& in, const CallArgs&) {
  std::string out;
  for (char c : ToStr(in)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::Str(std::move(out));
}

struct FilterEntry {
  absl::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", Abs},
    {"capitalize", Capitalize},
    {"count", Length},
    {"d", Default},
    {"default", Default},
    {"e", Escape},
    {"escape", Escape},
    {"first", First},
    {"float", Float},
    {"int", Int},
    {"items", Items},
    {"join", Join},
    {"last", Last},
    {"length", Length},
    {"list", ListFilter},
    {"lower", Lower},
    {"map", Map},
    {"reject", Reject},
    {"rejectattr", RejectAttr},
    {"replace", Replace},
    {"reverse", Reverse},
    {"safe", Safe},
    {"select", Select},
    {"selectattr", SelectAttr},
    {"string", String},
    {"title", Title},
    {"tojson", ToJsonFilter},
    {"trim", Trim},
    {"upper", Upper},
};

}  // namespace

bool IsSupportedFilter(absl::string_view name) {
  for (const FilterEntry& e : kFilters) {
    if (e.name == name) return true;
  }
  return false;
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input,
                                  const CallArgs& args) {
  for (const FilterEntry& e : kFilters) {
    if (e.name == name) return e.fn(input, args);
  }
  return absl::UnimplementedError(absl::StrCat("unsupported Jinja filter '", name, "'"));
}

}  // namespace tandem::tokenizer::chat
