// Tests of the chat-template interpreter: real model templates against outputs of Python
// jinja2 / transformers (testdata/expected.json, written by testdata/make_expected.py), small
// templates exercising each construct (also checked against jinja2), and the errors for
// constructs outside the subset.
#include "tokenizer/chat/chat_template.h"

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer::chat {
namespace {

constexpr char kTestdata[] = "tokenizer/chat/testdata/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::ordered_json& Expected() {
  static const auto* expected = new nlohmann::ordered_json(
      nlohmann::ordered_json::parse(ReadFile(absl::StrCat(kTestdata, "expected.json"))));
  return *expected;
}

// Renders `source` with `context`; "ERROR: <message>" on failure.
std::string RenderOrError(absl::string_view source, const nlohmann::ordered_json& context) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return absl::StrCat("ERROR: ", tmpl.status().message());
  auto out = (*tmpl)->Render(context);
  if (!out.ok()) return absl::StrCat("ERROR: ", out.status().message());
  return *out;
}

std::string R(absl::string_view source, const std::string& context_json = "{}") {
  return RenderOrError(source, nlohmann::ordered_json::parse(context_json));
}

TEST(ChatTemplateGoldenTest, RealTemplatesMatchJinja2) {
  std::map<std::string, std::unique_ptr<ChatTemplate>> templates;
  std::map<std::string, std::pair<int, int>> counts;  // template -> (passed, total)
  int total = 0;
  for (const auto& c : Expected()["cases"]) {
    const std::string name = c["template"];
    SCOPED_TRACE(absl::StrCat(name, " ", c["case"].get<std::string>()));
    if (!templates.count(name)) {
      auto parsed =
          ChatTemplate::Parse(ReadFile(absl::StrCat(kTestdata, "templates/", name, ".jinja")));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      templates[name] = std::move(*parsed);
    }
    auto out = templates[name]->Render(c["context"]);
    bool passed = false;
    if (c.contains("output")) {
      EXPECT_TRUE(out.ok()) << out.status();
      if (out.ok()) {
        EXPECT_EQ(*out, c["output"].get<std::string>());
        passed = *out == c["output"].get<std::string>();
      }
    } else {
      EXPECT_FALSE(out.ok());
      if (!out.ok()) {
        EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>());
        passed = out.status().message() == c["error"].get<std::string>();
      }
    }
    ++total;
    counts[name].first += passed;
    ++counts[name].second;
  }
  for (const auto& [name, n] : counts) {
    std::cout << name << ": " << n.first << "/" << n.second << " cases byte-identical\n";
  }
  EXPECT_GE(total, 170);
  EXPECT_EQ(counts.size(), 11u);
}

TEST(ChatTemplateGoldenTest, UnitTemplatesMatchJinja2) {
  const auto& context = Expected()["unit_context"];
  int n = 0;
  for (const auto& c : Expected()["unit_cases"]) {
    const std::string source = c["source"];
    SCOPED_TRACE(source);
    const std::string got = RenderOrError(source, context);
    if (c.contains("output")) {
      EXPECT_EQ(got, c["output"].get<std::string>());
    } else {
      EXPECT_EQ(got, absl::StrCat("ERROR: ", c["error"].get<std::string>()));
    }
    ++n;
  }
  EXPECT_GE(n, 50);
}

TEST(ChatTemplateTest, WhitespaceControl) {
  EXPECT_EQ(R("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(R("a {#- note -#} b"), "ab");
  // trim_blocks: the newline after a block tag goes, the one after {{ }} stays.
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\n{{ 'y' }}\nz\n"), "x\ny\nz");
  // lstrip_blocks: indentation before a block tag goes, before {{ }} or after {%+ stays.
  EXPECT_EQ(R("  {% if true %}x{% endif %}\n  {{ 'y' }}"), "x  y");
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(R("a\r\nb\r\n"), "a\nb");  // Newlines normalized, one trailing newline dropped.
}

TEST(ChatTemplateTest, LoopsAndNamespaces) {
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ '' if loop.last else ',' }}"
              "{% endfor %}",
              R"({"xs": ["a", "b", "c"]})"),
            "1/3,2/3,3/3");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}"
              "{% set local = x %}{% endfor %}{{ ns.n }}{{ local is defined }}"),
            "6False");
  EXPECT_EQ(R("{% for k, v in d.items() if k != 'skip' %}{{ k }}={{ v }}{{ ';' if not loop.last }}"
              "{% endfor %}",
              R"({"d": {"z": 1, "skip": 2, "a": 3}})"),
            "z=1;a=3");
}

TEST(ChatTemplateTest, UndefinedBehavesLikeJinja2) {
  EXPECT_EQ(R("[{{ missing }}][{{ missing is defined }}][{{ missing|default('d') }}]"),
            "[][False][d]");
  EXPECT_EQ(R("{% if missing %}yes{% else %}no{% endif %}"), "no");
  EXPECT_EQ(R("{{ missing.attr }}"), "ERROR: 'missing' is undefined");
  EXPECT_EQ(R("{{ m.nope }}|{{ m.nope.x }}", R"({"m": {}})"),
            "ERROR: 'dict object' has no attribute 'nope'");
}

TEST(ChatTemplateTest, RaiseExceptionIsInvalidArgumentWithMessage) {
  auto tmpl = ChatTemplate::Parse("{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = (*tmpl)->Render(nlohmann::json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate");
}

TEST(ChatTemplateTest, StrftimeNowUsesTheLocalDate) {
  const std::string before = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
  const std::string got = R("{{ strftime_now('%d %b %Y') }}");
  const std::string after = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
  EXPECT_TRUE(got == before || got == after) << got;
}

TEST(ChatTemplateTest, UnsupportedConstructsAreNamed) {
  auto code_of = [](absl::string_view source) {
    auto tmpl = ChatTemplate::Parse(source);
    return tmpl.ok() ? absl::StatusCode::kOk : tmpl.status().code();
  };
  EXPECT_EQ(R("{{ x|xmlattr }}"), "ERROR: unsupported Jinja filter 'xmlattr'");
  EXPECT_EQ(R("{{ x is escaped }}"), "ERROR: unsupported Jinja test 'escaped'");
  EXPECT_EQ(R("{% macro m() %}x{% endmacro %}"), "ERROR: unsupported Jinja tag 'macro'");
  EXPECT_EQ(R("{% include 'x' %}"), "ERROR: unsupported Jinja tag 'include'");
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}"), "ERROR: unsupported Jinja tag 'raw'");
  EXPECT_EQ(R("{% for x in y recursive %}{% endfor %}"),
            "ERROR: unsupported Jinja construct 'recursive' for loop");
  EXPECT_EQ(R("{{ '%s' % 1 }}"),
            "ERROR: unsupported Jinja construct: printf-style string formatting ('%')");
  EXPECT_EQ(R("{{ cycler(1, 2) }}"), "ERROR: unsupported Jinja global 'cycler'");
  EXPECT_EQ(R("{{ xs|map('wordcount')|list }}", R"({"xs": ["a"]})"),
            "ERROR: unsupported Jinja filter 'wordcount'");
  EXPECT_EQ(code_of("{{ x|pprint }}"), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code_of("{% if x %}"), absl::StatusCode::kInvalidArgument);  // Syntax error.
  EXPECT_EQ(code_of("{{ x "), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, SandboxForbidsMutation) {
  EXPECT_EQ(R("{% set xs = [] %}{{ xs.append(1) }}"),
            "ERROR: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(R("{{ d.update({}) }}", R"({"d": {}})"),
            "ERROR: access to attribute 'update' of 'dict' object is unsafe.");
}

TEST(ChatTemplateTest, KeyOrderFollowsTheJsonType) {
  const std::string source = "{{ d|tojson }}";
  // ordered_json keeps document order (as Python does); nlohmann::json sorts keys.
  EXPECT_EQ(R(source, R"({"d": {"b": 1, "a": 2}})"), R"({"b": 1, "a": 2})");
  auto tmpl = ChatTemplate::Parse(source);
  ASSERT_TRUE(tmpl.ok());
  auto out = (*tmpl)->Render(nlohmann::json::parse(R"({"d": {"b": 1, "a": 2}})"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, R"({"a": 2, "b": 1})");
}

TEST(ChatTemplateFromConfigTest, StringListAndMissing) {
  const auto config = nlohmann::json::parse(
      ReadFile(absl::StrCat(kTestdata, "configs/qwen2.5_tokenizer_config.json")));
  auto tmpl = ChatTemplateFromConfig(config);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(*tmpl, ReadFile(absl::StrCat(kTestdata, "templates/qwen2.5-7b-instruct.jinja")));

  auto list = ChatTemplateFromConfig(nlohmann::json::parse(
      R"({"chat_template": [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D"}]})"));
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, "D");
  EXPECT_EQ(ChatTemplateFromConfig(nlohmann::json::parse(R"({"eos_token": "x"})")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplateFromConfig(
                nlohmann::json::parse(R"({"chat_template": [{"name": "rag", "template": "R"}]})"))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(ChatTemplateTest, TwentyMessagesRenderWellUnderAMillisecond) {
  auto tmpl = ChatTemplate::Parse(
      ReadFile(absl::StrCat(kTestdata, "templates/llama-3.1-8b-instruct.jinja")));
  ASSERT_TRUE(tmpl.ok());
  nlohmann::ordered_json context = {{"bos_token", "<|begin_of_text|>"},
                                    {"add_generation_prompt", true},
                                    {"messages", nlohmann::ordered_json::array()}};
  context["messages"].push_back({{"role", "system"}, {"content", "You are helpful."}});
  for (int i = 0; i < 20; ++i) {
    context["messages"].push_back(
        {{"role", i % 2 ? "assistant" : "user"},
         {"content", absl::StrCat("Message number ", i, " with some text in it.")}});
  }
  constexpr int kIters = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) ASSERT_TRUE((*tmpl)->Render(context).ok());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      kIters;
  std::cout << "llama-3.1 template, 21 messages: " << us << " us per render\n";
  EXPECT_LT(us, 1000);
}

}  // namespace
}  // namespace tandem::tokenizer::chat
