#include "tokenizer/chat/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer::chat {
namespace {

enum class TagKind { kVar, kBlock, kComment };

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// jinja2 normalizes newlines to "\n" and drops one trailing newline.
std::string NormalizeSource(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : src_(NormalizeSource(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) RETURN_IF_ERROR(LexDataAndTag());
    Push(Token::Type::kEof, "");
    return std::move(out_);
  }

 private:
  int LineAt(size_t pos) {
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }
  void Push(Token::Type type, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = LineAt(pos_);
    out_.push_back(std::move(t));
  }
  absl::Status Error(absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("template syntax error (line ", LineAt(pos_), "): ", what));
  }

  absl::Status LexDataAndTag();
  void EmitData(std::string text, char strip_sign, TagKind kind);
  absl::Status LexComment();
  absl::Status LexTagBody(TagKind kind);
  absl::Status LexString();
  absl::Status AppendEscape(size_t* i, std::string* value);
  absl::Status LexNumber();
  bool AtTagEnd(TagKind kind);

  std::string src_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  int depth_ = 0;
  std::vector<Token> out_;
};

absl::Status Lexer::LexDataAndTag() {
  size_t start = pos_;
  size_t tag = std::string::npos;
  TagKind kind = TagKind::kVar;
  for (size_t i = pos_; i + 1 < src_.size(); ++i) {
    if (src_[i] != '{') continue;
    const char c = src_[i + 1];
    if (c == '{' || c == '%' || c == '#') {
      tag = i;
      kind = c == '{' ? TagKind::kVar : c == '%' ? TagKind::kBlock : TagKind::kComment;
      break;
    }
  }
  if (tag == std::string::npos) {
    if (pos_ < src_.size()) Push(Token::Type::kText, src_.substr(pos_));
    pos_ = src_.size();
    return absl::OkStatus();
  }
  pos_ = tag + 2;
  char strip_sign = 0;
  if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) strip_sign = src_[pos_++];
  EmitData(src_.substr(start, tag - start), strip_sign, kind);
  if (kind == TagKind::kComment) return LexComment();
  if (kind == TagKind::kBlock) {
    size_t p = pos_;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") == 0 && (p + 3 >= src_.size() || !IsNameChar(src_[p + 3]))) {
      return absl::UnimplementedError("unsupported Jinja tag 'raw'");
    }
  }
  Push(kind == TagKind::kVar ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "");
  return LexTagBody(kind);
}

void Lexer::EmitData(std::string text, char strip_sign, TagKind kind) {
  if (strip_sign == '-') {
    size_t end = text.size();
    while (end > 0 && IsSpace(text[end - 1])) --end;
    text.resize(end);
  } else if (strip_sign != '+' && kind != TagKind::kVar) {  // lstrip_blocks.
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
      bool all_space = true;
      for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && IsSpace(text[i]);
      if (all_space) text.resize(l_pos);
    }
  }
  if (!text.empty()) {
    Token t;
    t.type = Token::Type::kText;
    t.text = std::move(text);
    t.line = LineAt(pos_);
    out_.push_back(std::move(t));
  }
}

// Consumes a tag end ("-%}" + whitespace, "+%}", "%}" + one newline (trim_blocks)).
absl::Status Lexer::LexComment() {
  for (size_t i = pos_; i + 1 < src_.size(); ++i) {
    if (src_[i] != '#' || src_[i + 1] != '}') continue;
    size_t end = i + 2;
    if (i > pos_ && src_[i - 1] == '-') {
      while (end < src_.size() && IsSpace(src_[end])) ++end;
    } else if (!(i > pos_ && src_[i - 1] == '+') && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    pos_ = end;
    line_starting_ = src_[end - 1] == '\n';
    return absl::OkStatus();
  }
  return Error("unterminated comment");
}

bool Lexer::AtTagEnd(TagKind kind) {
  const char* end = kind == TagKind::kVar ? "}}" : "%}";
  size_t p = pos_;
  char sign = 0;
  if (p < src_.size() && (src_[p] == '-' || (src_[p] == '+' && kind == TagKind::kBlock))) {
    sign = src_[p++];
  }
  if (src_.compare(p, 2, end) != 0) return false;
  p += 2;
  if (sign == '-') {
    while (p < src_.size() && IsSpace(src_[p])) ++p;
  } else if (sign == 0 && kind == TagKind::kBlock && p < src_.size() && src_[p] == '\n') {
    ++p;  // trim_blocks
  }
  Push(kind == TagKind::kVar ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "");
  pos_ = p;
  line_starting_ = src_[p - 1] == '\n';
  return true;
}

absl::Status Lexer::LexTagBody(TagKind kind) {
  static constexpr absl::string_view kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
  static constexpr absl::string_view kOps1 = "+-/*%~[](){}><=.:|,;";
  depth_ = 0;
  while (true) {
    while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
    if (pos_ >= src_.size()) return Error("unexpected end of template inside a tag");
    if (depth_ == 0 && AtTagEnd(kind)) return absl::OkStatus();
    const char c = src_[pos_];
    if (c == '\'' || c == '"') {
      RETURN_IF_ERROR(LexString());
    } else if (IsDigit(c)) {
      RETURN_IF_ERROR(LexNumber());
    } else if (IsNameStart(c)) {
      size_t end = pos_;
      while (end < src_.size() && IsNameChar(src_[end])) ++end;
      Push(Token::Type::kName, src_.substr(pos_, end - pos_));
      pos_ = end;
    } else {
      bool matched = false;
      for (absl::string_view op : kOps2) {
        if (src_.compare(pos_, 2, op.data(), 2) == 0) {
          Push(Token::Type::kOp, std::string(op));
          pos_ += 2;
          matched = true;
          break;
        }
      }
      if (!matched) {
        if (kOps1.find(c) == absl::string_view::npos) {
          return Error(absl::StrCat("unexpected char '", std::string(1, c), "'"));
        }
        if (c == '(' || c == '[' || c == '{') ++depth_;
        if ((c == ')' || c == ']' || c == '}') && depth_ > 0) --depth_;
        Push(Token::Type::kOp, std::string(1, c));
        ++pos_;
      }
    }
  }
}

absl::Status Lexer::AppendEscape(size_t* i, std::string* value) {
  const char e = src_[*i];
  uint32_t cp = 0;
  switch (e) {
    case 'n':
      value->push_back('\n');
      return absl::OkStatus();
    case 't':
      value->push_back('\t');
      return absl::OkStatus();
    case 'r':
      value->push_back('\r');
      return absl::OkStatus();
    case 'a':
      value->push_back('\a');
      return absl::OkStatus();
    case 'b':
      value->push_back('\b');
      return absl::OkStatus();
    case 'f':
      value->push_back('\f');
      return absl::OkStatus();
    case 'v':
      value->push_back('\v');
      return absl::OkStatus();
    case '\\':
    case '\'':
    case '"':
      value->push_back(e);
      return absl::OkStatus();
    case '\n':
      return absl::OkStatus();  // Line continuation.
    case 'N':
      return absl::UnimplementedError("unsupported string escape '\\N{...}'");
    case 'x':
    case 'u':
    case 'U': {
      const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      if (*i + n >= src_.size()) return Error("invalid escape in string literal");
      for (size_t k = 1; k <= n; ++k) {
        const char h = src_[*i + k];
        if (!absl::ascii_isxdigit(h)) return Error("invalid escape in string literal");
        cp = cp * 16 + (IsDigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10);
      }
      if (cp > 0x10FFFF) return Error("invalid escape in string literal");
      AppendUtf8(cp, value);
      *i += n;
      return absl::OkStatus();
    }
    default:
      break;
  }
  if (e < '0' || e > '7') {  // Unknown escapes stay as written.
    value->push_back('\\');
    value->push_back(e);
    return absl::OkStatus();
  }
  for (int n = 0; n < 3 && *i < src_.size() && src_[*i] >= '0' && src_[*i] <= '7'; ++n) {
    cp = cp * 8 + (src_[(*i)++] - '0');
  }
  --*i;
  AppendUtf8(cp, value);
  return absl::OkStatus();
}

absl::Status Lexer::LexString() {
  const char quote = src_[pos_];
  std::string value;
  size_t i = pos_ + 1;
  for (; i < src_.size() && src_[i] != quote; ++i) {
    if (src_[i] != '\\') {
      value.push_back(src_[i]);
    } else if (++i < src_.size()) {
      RETURN_IF_ERROR(AppendEscape(&i, &value));
    }
  }
  if (i >= src_.size()) return Error("unterminated string literal");
  Push(Token::Type::kString, std::move(value));
  pos_ = i + 1;
  return absl::OkStatus();
}

absl::Status Lexer::LexNumber() {
  auto digits = [&](size_t p) {  // \d+(_\d+)*
    while (p < src_.size() &&
           (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1])))) {
      ++p;
    }
    return p;
  };
  const size_t start = pos_;
  size_t end = digits(pos_);
  bool is_float = false;
  const bool after_dot = start > 0 && src_[start - 1] == '.';
  if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && IsDigit(src_[end + 1])) {
    end = digits(end + 1);
    is_float = true;
  }
  if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
    size_t p = end + 1;
    if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
    if (p < src_.size() && IsDigit(src_[p])) {
      end = digits(p);
      is_float = true;
    }
  }
  std::string text;
  for (size_t i = start; i < end; ++i) {
    if (src_[i] != '_') text.push_back(src_[i]);
  }
  Token t;
  t.line = LineAt(pos_);
  errno = 0;
  if (is_float) {
    t.type = Token::Type::kFloat;
    t.float_value = std::strtod(text.c_str(), nullptr);
  } else {
    t.type = Token::Type::kInt;
    t.int_value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE) return absl::UnimplementedError("integer literal out of int64 range");
  }
  out_.push_back(std::move(t));
  pos_ = end;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace tandem::tokenizer::chat
