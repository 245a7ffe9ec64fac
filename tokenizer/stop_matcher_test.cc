// StopMatcher against a reference (the full text cut before the stop string that completes first,
// ties to the one starting first) on random texts split into random chunks, stop strings straddling
// chunk boundaries, overlapping and multi-byte stops; and what is held back is only a possible
// stop-string prefix.
#include "tokenizer/stop_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

std::string Reference(const std::string& text, const std::vector<std::string>& stops,
                      bool* stopped) {
  size_t best = std::string::npos, best_end = std::string::npos;
  for (const std::string& s : stops) {
    const size_t at = s.empty() ? std::string::npos : text.find(s);
    if (at == std::string::npos) continue;
    if (at + s.size() < best_end || (at + s.size() == best_end && at < best)) {
      best = at;
      best_end = at + s.size();
    }
  }
  *stopped = best != std::string::npos;
  return *stopped ? text.substr(0, best) : text;
}

TEST(StopMatcherTest, StraddlingStopsAndHeldBackPrefixes) {
  StopMatcher m({"</s>", "\n\n"});
  EXPECT_EQ(m.Add("Hello <").emit, "Hello ");  // "<" may begin "</s>"
  EXPECT_EQ(m.Add("/").emit, "");
  StopMatcher::Result r = m.Add("s> and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(r.matched, "</s>");
  EXPECT_EQ(m.Add("ignored").emit, "");
  StopMatcher n({"</s>"});
  EXPECT_EQ(n.Add("a <b").emit, "a <b");  // "<b" cannot begin it
  EXPECT_EQ(n.Add(" <").emit, " ");
  EXPECT_EQ(n.Flush(), "<");
  // The stop that completes first wins, even if a longer one started earlier.
  StopMatcher first({"<\nb", "\n"});
  r = first.Add("<\n");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "<");
  StopMatcher cjk({"。終"});
  EXPECT_EQ(cjk.Add("文。").emit, "文");
  r = cjk.Add("終わり");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
}

TEST(StopMatcherTest, RandomStreamsMatchTheReference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::string alphabet = "ab\n<>/s";
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text(rng() % 40, 'a');
    for (char& c : text) c = alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops(1 + rng() % 3);
    for (std::string& s : stops) {
      s.resize(1 + rng() % 4);
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
    }
    bool want_stop = false;
    const std::string want = Reference(text, stops, &want_stop);
    StopMatcher m(stops);
    std::string got;
    bool stopped = false;
    for (size_t at = 0; at < text.size() && !stopped;) {
      const size_t n = 1 + rng() % 5;
      StopMatcher::Result r = m.Add(text.substr(at, n));
      got += r.emit;
      stopped = r.stopped;
      at += n;
    }
    if (!stopped) got += m.Flush();
    EXPECT_EQ(stopped, want_stop) << text;
    EXPECT_EQ(got, want) << text;
  }
}

}  // namespace
}  // namespace tandem::tokenizer
