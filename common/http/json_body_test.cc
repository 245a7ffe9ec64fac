#include "common/http/json_body.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace tandem::http {
namespace {

std::string Nested(int depth, char open, char close, const std::string& inner = "1") {
  return std::string(depth, open) + inner + std::string(depth, close);
}

TEST(JsonBodyTest, DepthAtTheLimitParses) {
  absl::StatusOr<nlohmann::json> j = ParseJsonBody(Nested(kMaxJsonDepth, '[', ']'));
  ASSERT_TRUE(j.ok()) << j.status();
  const nlohmann::json* v = &*j;
  for (int i = 0; i < kMaxJsonDepth; ++i) {
    ASSERT_TRUE(v->is_array());
    v = &(*v)[0];
  }
  EXPECT_EQ(*v, 1);
}

TEST(JsonBodyTest, DeeperThanTheLimitIsRefusedNamingIt) {
  for (const std::string& body :
       {Nested(kMaxJsonDepth + 1, '[', ']'), Nested(50000, '[', ']'),
        std::string(100000, '['),  // unterminated: still refused for depth, without recursion
        "{\"messages\": [{\"role\": \"user\", \"content\": " + Nested(50000, '[', ']') + "}]}"}) {
    absl::StatusOr<nlohmann::json> j = ParseJsonBody(body);
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(j.status().message().find(std::to_string(kMaxJsonDepth)), std::string::npos)
        << j.status();
  }
}

TEST(JsonBodyTest, ObjectsCountLikeArrays) {
  std::string deep;
  for (int i = 0; i < 10; ++i) deep += "{\"a\":";
  deep += "1" + std::string(10, '}');
  EXPECT_TRUE(CheckJsonDepth(deep, 10).ok());
  EXPECT_FALSE(CheckJsonDepth(deep, 9).ok());
}

TEST(JsonBodyTest, BracketsInStringsDoNotCount) {
  const std::string text = "[\"" + std::string(1000, '[') + "\\\"[[[\", \"\\\\\", [1]]";
  EXPECT_TRUE(CheckJsonDepth(text, 2).ok());
  absl::StatusOr<nlohmann::json> j = ParseJsonBody(text, 2);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)[0].get<std::string>(), std::string(1000, '[') + "\"[[[");
  EXPECT_EQ((*j)[1].get<std::string>(), "\\");
  EXPECT_FALSE(CheckJsonDepth(text, 1).ok());
}

TEST(JsonBodyTest, BadJsonIsNamed) {
  absl::StatusOr<nlohmann::json> j = ParseJsonBody("{\"a\": ");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().message(), "the body is not valid JSON");
}

// The scanner's depth equals the parsed value's on random documents.
int ParsedDepth(const nlohmann::json& j) {
  if (!j.is_structured()) return 0;
  int deepest = 0;
  for (const auto& child : j) deepest = std::max(deepest, ParsedDepth(child));
  return deepest + 1;
}

nlohmann::json RandomDoc(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 12 ? 2 : 5);
  switch (kind(rng)) {
    case 0:
      return static_cast<int>(rng() % 100);
    case 1:
      return std::string(rng() % 4, "[]{}\"\\x"[rng() % 7]);
    case 2:
      return nullptr;
    case 3:
    case 4: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = rng() % 3; i > 0; --i) a.push_back(RandomDoc(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = rng() % 3; i > 0; --i) o[std::to_string(i) + "]"] = RandomDoc(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonBodyTest, ScannerDepthMatchesTheParsedValueOnRandomDocuments) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const nlohmann::json doc = RandomDoc(rng, 0);
    const std::string text = doc.dump();
    const int depth = ParsedDepth(doc);
    EXPECT_TRUE(CheckJsonDepth(text, std::max(depth, 1)).ok()) << text;
    if (depth > 0) {
      EXPECT_FALSE(CheckJsonDepth(text, depth - 1).ok()) << text;
    }
  }
}

}  // namespace
}  // namespace tandem::http
