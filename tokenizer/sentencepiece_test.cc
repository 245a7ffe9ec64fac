// SentencePiece through libtandem_spm.so in its own link namespace (sentencepiece_library.h):
// a missing library is an error naming where it was looked for; our token-by-token decoder
// equals the library's own Decode on thousands of arbitrary id sequences (byte pieces making
// valid, cut and invalid UTF-8, control and unknown pieces, spaces); and the library serves
// encodes from many threads at once (its namespace has its own malloc and libstdc++).
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tokenizer/sentencepiece_library.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/text_tokenizer.h"

namespace tandem::tokenizer {
namespace {

std::string TestData() {
  const char* dir = std::getenv("TANDEM_TOKENIZER_TESTDATA");
  return dir != nullptr ? dir : "tokenizer/testdata";
}

// One test, so that the steps run in this order in a fresh process: Default() has not loaded
// the library before the missing path is tried (a failure is not remembered).
TEST(SentencePieceLibraryTest, AMissingLibraryIsNamedThenTheRealOneLoads) {
  const std::string missing = ::testing::TempDir() + "/nowhere/libtandem_spm.so";
  ASSERT_EQ(setenv("TANDEM_SPM_LIBRARY", missing.c_str(), 1), 0);
  EXPECT_EQ(SentencePieceLibrary::CandidatePaths(), std::vector<std::string>{missing});
  auto tok = LoadTokenizer(TestData() + "/mistral_v1");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find(missing), std::string::npos) << tok.status();
  EXPECT_NE(tok.status().message().find("TANDEM_SPM_LIBRARY"), std::string::npos);
  auto not_a_library = SentencePieceLibrary::Load(TestData() + "/corpus.json");
  EXPECT_EQ(not_a_library.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_a_library.status().message().find("corpus.json"), std::string::npos);

  ASSERT_EQ(unsetenv("TANDEM_SPM_LIBRARY"), 0);
  auto lib = SentencePieceLibrary::Default();
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_NE((*lib)->path.find("libtandem_spm.so"), std::string::npos);
  tok = LoadTokenizer(TestData() + "/mistral_v1");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto bad_model = SentencePieceTokenizer::FromFile(TestData() + "/corpus.json");
  EXPECT_EQ(bad_model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_model.status().message().find("corpus.json"), std::string::npos);
}

// The library's own Decode of `ids` (SentencePiece 0.1.97, Debian's: the same decoder logic as
// the Python package that wrote expected.json).
std::string LibraryDecode(const SentencePieceLibrary& lib, const tandem_spm_model* model,
                          const std::vector<int32_t>& ids) {
  char* text = nullptr;
  char* error = nullptr;
  size_t len = 0;
  if (lib.decode(model, ids.data(), ids.size(), &text, &len, &error) != 0) {
    ADD_FAILURE() << lib.TakeError(error);
    return "";
  }
  std::string out(text, len);
  lib.free(text);
  return out;
}

class SentencePieceModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SentencePieceModelTest, DecodesArbitraryIdsAsTheLibrary) {
  const std::string path = TestData() + "/" + GetParam() + "/tokenizer.model";
  auto tok = SentencePieceTokenizer::FromFile(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const SentencePieceLibrary& lib = **SentencePieceLibrary::Default();
  char* error = nullptr;
  tandem_spm_model* model = lib.load(path.c_str(), &error);
  ASSERT_NE(model, nullptr) << lib.TakeError(error);
  // Ids drawn mostly from the pieces that interact: bytes, control/unknown, "▁".
  std::vector<int32_t> bytes, specials, spaces;
  for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) {
    const SentencePieceTokenizer::Piece& p = (*tok)->piece(id);
    if (p.type & TANDEM_SPM_PIECE_BYTE) bytes.push_back(id);
    if (p.type & (TANDEM_SPM_PIECE_CONTROL | TANDEM_SPM_PIECE_UNKNOWN)) specials.push_back(id);
    if (p.type == 0 && p.text.find_first_not_of("\xE2\x96\x81") == std::string::npos) {
      spaces.push_back(id);
    }
  }
  ASSERT_EQ(bytes.size(), 256u);
  std::mt19937 rng(19);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 12);
    for (int32_t& id : ids) {
      const uint32_t r = rng() % 10;
      // 0xC0 + ... : lead bytes, 0x80 + ...: continuation bytes, so that runs are often valid.
      id = r < 2   ? bytes[0x80 + rng() % 0x80]
           : r < 4 ? bytes[rng() % 256]
           : r < 5 ? specials[rng() % specials.size()]
           : r < 6 ? spaces[rng() % spaces.size()]
                   : static_cast<int32_t>(rng() % (*tok)->vocab_size());
    }
    auto ours = (*tok)->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(ours.ok()) << ours.status();
    std::string ids_text;
    for (int32_t id : ids) ids_text += std::to_string(id) + " ";
    ASSERT_EQ(*ours, LibraryDecode(lib, model, ids)) << "ids: " << ids_text;
  }
  lib.unload(model);
}

TEST_P(SentencePieceModelTest, EncodesFromManyThreads) {
  auto tok = LoadTokenizer(TestData() + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "Grüße, 世界! 😀 The quick brown fox. ";
  const std::vector<int32_t> want = *(*tok)->Encode(text, true);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        auto ids = (*tok)->Encode(text, true);
        if (!ids.ok() || *ids != want) ++mismatches[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePieceModelTest,
                         ::testing::Values("mistral_v1", "mistral_v3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::tokenizer
