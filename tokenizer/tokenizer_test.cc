// Tokenizers against their references on real tokenizer files (testdata/<family>/: a
// tokenizer.json checked against Hugging Face's `tokenizers`, or a SentencePiece tokenizer.model
// checked against SentencePiece's Python package; files from PyPI wheels, testdata/fixtures.txt;
// expected.json written by make_expected.py): for every corpus text, ids with and without
// special tokens identical, decodings identical, and the incremental decoder's chunks are valid
// UTF-8 that concatenate to the full decode. Also: invalid UTF-8 input and unsupported
// components fail with errors naming them.
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/text_tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

// Bazel runs tests in the runfiles root; TANDEM_TOKENIZER_TESTDATA overrides.
std::string TestData() {
  const char* dir = std::getenv("TANDEM_TOKENIZER_TESTDATA");
  return dir != nullptr ? dir : "tokenizer/testdata";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Families() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(TestData())) {
    if (std::filesystem::exists(entry.path() / "expected.json")) {
      out.push_back(entry.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Streaming: valid UTF-8 per chunk, the whole decoding in the end.
void ExpectStreamsDecode(const TextTokenizer& tok, const std::vector<int32_t>& ids,
                         const std::string& decoded, const std::string& skipped) {
  for (bool skip : {false, true}) {
    IncrementalDecoder stream(tok, skip);
    std::string all;
    for (int32_t id : ids) {
      auto chunk = stream.Add(id);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      EXPECT_TRUE(ValidateUtf8(*chunk).ok());
      all += *chunk;
    }
    all += stream.Flush();
    EXPECT_EQ(all, skip ? skipped : decoded);
  }
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, MatchesTheReference) {
  const std::string dir = TestData() + "/" + GetParam();
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(dir + "/expected.json"));
  int cases = 0;
  for (const nlohmann::json& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(::testing::Message() << GetParam() << ": '" << text << "'");
    auto ids = (*tok)->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>());
    auto with = (*tok)->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(with.ok()) << with.status();
    EXPECT_EQ(*with, c["ids_with_special"].get<std::vector<int32_t>>());
    const std::vector<int32_t> want = c["ids_with_special"].get<std::vector<int32_t>>();
    auto decoded = (*tok)->Decode(want, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (c.contains("decoded")) {  // SentencePiece's decoder has no "keep special" mode
      EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
    }
    auto skipped = (*tok)->Decode(want, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>());
    ExpectStreamsDecode(**tok, want, *decoded, *skipped);
    ++cases;
  }
  EXPECT_GT(cases, 20);
}

// Arbitrary ids (as a model may generate): byte tokens that make valid, cut and invalid UTF-8
// around specials and spaces decode as the reference does, whole and streamed.
TEST_P(FixtureTest, DecodesArbitraryIdsAsTheReference) {
  const std::string dir = TestData() + "/" + GetParam();
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(dir + "/expected.json"));
  ASSERT_GE(expected["decode_cases"].size(), 20u);
  for (const nlohmann::json& c : expected["decode_cases"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(::testing::Message() << GetParam() << ": " << c["ids"].dump());
    auto decoded = (*tok)->Decode(ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (c.contains("decoded")) {
      EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
    }
    auto skipped = (*tok)->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>());
    ExpectStreamsDecode(**tok, ids, *decoded, *skipped);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, ::testing::ValuesIn(Families()),
                         [](const auto& info) { return info.param; });

TEST(TokenizerTest, SplitCharactersStreamWholeAndInvalidInputIsRefused) {
  const std::vector<std::string> families = Families();
  ASSERT_FALSE(families.empty());
  auto tok = LoadTokenizer(TestData() + "/" + families[0]);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // A CJK character and an emoji are several byte-level tokens each: chunks never split them.
  auto ids = (*tok)->Encode("界😀", false);
  ASSERT_TRUE(ids.ok());
  IncrementalDecoder stream(**tok, false);
  std::vector<std::string> chunks;
  for (int32_t id : *ids) chunks.push_back(*stream.Add(id));
  chunks.push_back(stream.Flush());
  std::string joined;
  for (const std::string& c : chunks) {
    EXPECT_TRUE(c.empty() || c == "界" || c == "😀" || c == "界😀") << c;
    joined += c;
  }
  EXPECT_EQ(joined, "界😀");
  const auto bad = (*tok)->Encode("ok \xFF\xFE then", false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("byte 3"), std::string::npos) << bad.status();
  EXPECT_EQ((*tok)->Decode({(*tok)->vocab_size()}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  const std::vector<std::string> families = Families();
  ASSERT_FALSE(families.empty());
  const nlohmann::json doc =
      nlohmann::json::parse(ReadFile(TestData() + "/" + families[0] + "/tokenizer.json"));
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* named;
  };
  const std::vector<Case> cases = {
      {"decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
      {"post_processor", {{"type", "RobertaProcessing"}}, "RobertaProcessing"},
      {"decoder", nullptr, "no decoder"},
      {"decoder", nlohmann::json::parse(R"({"type": "Sequence", "decoders": [
           {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 1}]})"),
       "'Strip' after ByteFallback"},
      {"decoder", nlohmann::json::parse(R"({"type": "Sequence", "decoders": [
           {"type": "Fuse"}, {"type": "Metaspace", "replacement": "_"}]})"),
       "'Metaspace' after Fuse"},
      {"pre_tokenizer", nlohmann::json::parse(R"({"type": "Metaspace", "replacement": "_",
           "prepend_scheme": "sometimes"})"),
       "sometimes"},
  };
  for (const Case& c : cases) {
    nlohmann::json changed = doc;
    changed[c.key] = c.value;
    auto tok = Tokenizer::FromJson(changed.dump());
    ASSERT_FALSE(tok.ok()) << c.key;
    EXPECT_NE(tok.status().message().find(c.named), std::string::npos) << tok.status();
  }
  nlohmann::json unigram = doc;
  unigram["model"]["type"] = "Unigram";
  EXPECT_NE(Tokenizer::FromJson(unigram.dump()).status().message().find("Unigram"),
            std::string::npos);
  EXPECT_FALSE(Tokenizer::FromJson("{not json").ok());
}

}  // namespace
}  // namespace tandem::tokenizer
