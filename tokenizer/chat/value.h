// The runtime values of the chat-template interpreter: a small model of the Python objects a
// Jinja template sees (None, bool, int, float, str, list/tuple, dict, jinja2's Undefined and
// Namespace, and callables), with Python's truthiness, equality, str()/repr() and
// transformers' `tojson` (json.dumps) on them, and the conversion from nlohmann::json.
//
// Lists and dicts are immutable and shared (the sandbox forbids mutating them); a Namespace is
// shared and mutable (`{% set ns.x = ... %}` writes through every copy). Dicts keep insertion
// order, as Python's do.
//
// Thread safety: values are not synchronized; a render owns the values it creates.
#ifndef TANDEM_TOKENIZER_CHAT_VALUE_H_
#define TANDEM_TOKENIZER_CHAT_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::tokenizer::chat {

class Value;

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // Only changes repr(): (a, b) instead of [a, b].
};

// Insertion-ordered string-keyed mapping (chat contexts come from JSON: keys are strings).
using Dict = std::vector<std::pair<std::string, Value>>;

struct Namespace {
  Dict attrs;
};

// A builtin function (`name`, no receiver) or a method bound to `self` (e.g. "str.strip").
struct Callable {
  std::string name;
  std::shared_ptr<const Value> self;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  // Undefined. `hint` is jinja2's message for using it ("'x' is undefined").
  Value() : v_(UndefinedData{}) {}
  static Value Undefined(std::string hint);
  static Value None() { return Value(NoneData{}); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double d) { return Value(d); }
  static Value Str(std::string s) { return Value(std::move(s)); }
  static Value Str(absl::string_view s) { return Value(std::string(s.data(), s.size())); }
  static Value Str(const char* s) { return Value(std::string(s)); }
  static Value MakeList(std::vector<Value> items, bool is_tuple = false);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(Dict attrs);
  static Value MakeCallable(std::string name, std::optional<Value> self = std::nullopt);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is int.
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool bool_value() const { return std::get<bool>(v_); }
  int64_t int_value() const { return std::get<int64_t>(v_); }
  double float_value() const { return std::get<double>(v_); }
  // int (or bool) as int64; only for is_int() || is_bool().
  int64_t AsInt() const { return is_bool() ? (bool_value() ? 1 : 0) : int_value(); }
  // Any number as double.
  double AsDouble() const { return is_float() ? float_value() : static_cast<double>(AsInt()); }
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<std::shared_ptr<const List>>(v_); }
  const std::vector<Value>& items() const { return list().items; }
  const Dict& dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  Namespace& ns() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<UndefinedData>(v_).hint; }

  // Dict lookup (dicts only); nullptr when absent.
  const Value* Find(absl::string_view key) const;

  // Python's bool(x) (Undefined is false).
  bool Truthy() const;
  // jinja2's type name for messages: "str", "dict", "list", "NoneType", ...
  const char* TypeName() const;

 private:
  struct UndefinedData {
    std::string hint;
  };
  struct NoneData {};
  explicit Value(NoneData n) : v_(n) {}
  explicit Value(bool b) : v_(b) {}
  explicit Value(int64_t i) : v_(i) {}
  explicit Value(double d) : v_(d) {}
  explicit Value(std::string s) : v_(std::move(s)) {}

  std::variant<UndefinedData, NoneData, bool, int64_t, double, std::string,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Callable>>
      v_;
};

// Python's ==.
bool Equals(const Value& a, const Value& b);

// Python's str(x) as jinja2 renders `{{ x }}` (Undefined renders empty).
std::string ToStr(const Value& v);
// Appends ToStr(v) to `out`.
void AppendStr(const Value& v, std::string* out);
// Python's repr(x).
void AppendRepr(const Value& v, std::string* out);

struct JsonOptions {
  std::optional<std::string> indent;  // json.dumps(indent=...): spaces per level, or the string.
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// json.dumps(v, ...) as transformers' `tojson` filter calls it.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// Converts a nlohmann::json or nlohmann::ordered_json document (object key order is kept).
template <typename Json>
Value FromJson(const Json& j) {
  if (j.is_null()) return Value::None();
  if (j.is_boolean()) return Value::Bool(j.template get<bool>());
  if (j.is_number_unsigned()) {
    const uint64_t u = j.template get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
    return Value::Float(static_cast<double>(u));
  }
  if (j.is_number_integer()) return Value::Int(j.template get<int64_t>());
  if (j.is_number_float()) return Value::Float(j.template get<double>());
  if (j.is_string()) return Value::Str(j.template get_ref<const std::string&>());
  if (j.is_array()) {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto& e : j) items.push_back(FromJson(e));
    return Value::MakeList(std::move(items));
  }
  if (j.is_object()) {
    Dict dict;
    dict.reserve(j.size());
    for (auto it = j.begin(); it != j.end(); ++it)
      dict.emplace_back(it.key(), FromJson(it.value()));
    return Value::MakeDict(std::move(dict));
  }
  return Value::None();  // Binary / discarded: not produced by JSON parsing.
}

}  // namespace tandem::tokenizer::chat

#endif  // TANDEM_TOKENIZER_CHAT_VALUE_H_
