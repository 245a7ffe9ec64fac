// UTF-8 helpers against hand-checked cases of the Unicode "maximal subpart" rule (what Rust's
// from_utf8_lossy, and so Hugging Face's ByteLevel decoder, do), of SentencePiece's per-byte
// replacement, and random byte strings: the final prefix never changes its decoding when bytes
// are appended.
#include "tokenizer/utf8.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidatesAndNamesTheOffset) {
  EXPECT_TRUE(ValidateUtf8("héllo 😀 中文").ok());
  EXPECT_TRUE(ValidateUtf8("").ok());
  const absl::Status bad = ValidateUtf8("ab\xC3(");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("byte 2"), std::string::npos) << bad;
  EXPECT_FALSE(ValidateUtf8("\xED\xA0\x80").ok()) << "a surrogate";
  EXPECT_FALSE(ValidateUtf8("\xC0\xAF").ok()) << "an overlong form";
  EXPECT_FALSE(ValidateUtf8("\xF4\x90\x80\x80").ok()) << "beyond U+10FFFF";
  EXPECT_FALSE(ValidateUtf8("\xE4\xB8").ok()) << "truncated";
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("abc"), "abc");
  EXPECT_EQ(Utf8Lossy("a\xE4\xB8z"), std::string("a") + kFffd + "z");        // one subpart
  EXPECT_EQ(Utf8Lossy("\x80\x80"), std::string(kFffd) + kFffd);              // two stray bytes
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), kFffd);                               // truncated at the end
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);  // surrogate
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Utf8Test, LossyPerByteReplacesEveryInvalidByte) {  // SentencePiece's byte-piece runs
  EXPECT_EQ(Utf8LossyPerByte("abc"), "abc");
  EXPECT_EQ(Utf8LossyPerByte("a\xE4\xB8z"), std::string("a") + kFffd + kFffd + "z");
  EXPECT_EQ(Utf8LossyPerByte("\xF0\x9F\x98"), std::string(kFffd) + kFffd + kFffd);
  EXPECT_EQ(Utf8LossyPerByte("\xE4\xB8\x96\xFF"), std::string("\xE4\xB8\x96") + kFffd);
  EXPECT_EQ(Utf8LossyPerByte("\xF0\xE4\xB8\x96"), std::string(kFffd) + "\xE4\xB8\x96");
  EXPECT_EQ(Utf8LossyPerByte("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);
}

TEST(Utf8Test, FinalPrefixHoldsBackOnlyAnIncompleteTail) {
  EXPECT_EQ(Utf8FinalPrefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(Utf8FinalPrefix("ab\xE4\xB8\xAD"), 5u);
  EXPECT_EQ(Utf8FinalPrefix("ab\xE4("), 4u) << "invalid, not incomplete";
  EXPECT_EQ(Utf8FinalPrefix("\xFF"), 1u);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 12, '\0');
    for (char& c : bytes) {
      const uint32_t r = rng() % 4;
      c = static_cast<char>(r == 0   ? rng() % 0x80
                            : r == 1 ? 0x80 + rng() % 0x40
                                     : 0xC0 + rng() % 0x40);
    }
    // Decoding the final prefix, then the rest, gives the whole decoding.
    const size_t final_bytes = Utf8FinalPrefix(bytes);
    EXPECT_EQ(Utf8Lossy(bytes.substr(0, final_bytes)) + Utf8Lossy(bytes.substr(final_bytes)),
              Utf8Lossy(bytes));
    std::string extended = bytes + static_cast<char>(0x80 + rng() % 0x40);
    EXPECT_EQ(Utf8Lossy(extended).substr(0, Utf8Lossy(bytes.substr(0, final_bytes)).size()),
              Utf8Lossy(bytes.substr(0, final_bytes)));
    EXPECT_TRUE(ValidateUtf8(Utf8Lossy(bytes)).ok());
    // The same split serves the per-byte decoding (SentencePiece's streams).
    EXPECT_EQ(Utf8LossyPerByte(bytes.substr(0, final_bytes)) +
                  Utf8LossyPerByte(bytes.substr(final_bytes)),
              Utf8LossyPerByte(bytes));
    EXPECT_TRUE(ValidateUtf8(Utf8LossyPerByte(bytes)).ok());
  }
}

}  // namespace
}  // namespace tandem::tokenizer
