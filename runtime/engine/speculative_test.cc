// The n-gram drafter and the acceptance rule, on hand-made token sequences.
#include "runtime/engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

SpeculativeConfig Ngram(int64_t k, int64_t n_min, int64_t n_max) {
  SpeculativeConfig c;
  c.method = SpeculativeMethod::kNgram;
  c.num_speculative_tokens = k;
  c.ngram_min = n_min;
  c.ngram_max = n_max;
  return c;
}

TEST(NgramDraftTest, ContinuesTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  // Suffix [7, 8] occurred at 1 (followed by 9, 4) and at 5 (followed by 5, 6): the latest wins.
  const std::vector<int32_t> tokens = {3, 7, 8, 9, 4, 7, 8, 5, 6, 1, 7, 8};
  EXPECT_EQ(NgramDraft(tokens, Ngram(3, 1, 3), 3), (std::vector<int32_t>{5, 6, 1}));
  // max_tokens caps the draft.
  EXPECT_EQ(NgramDraft(tokens, Ngram(3, 1, 3), 1), (std::vector<int32_t>{5}));
  // A longer suffix that matches beats a more recent shorter one: [1, 2, 3] matches at 0 only,
  // [3] alone most recently at 4.
  const std::vector<int32_t> t2 = {1, 2, 3, 9, 3, 8, 1, 2, 3};
  EXPECT_EQ(NgramDraft(t2, Ngram(2, 1, 3), 2), (std::vector<int32_t>{9, 3}));
  EXPECT_EQ(NgramDraft(t2, Ngram(2, 1, 1), 2), (std::vector<int32_t>{8, 1}));
}

TEST(NgramDraftTest, PrefersAMatchFollowedByAWholeDraftInALoop) {
  // The latest [1, 2] (at 4) is followed by 2 tokens only; the one at 2 by the 4 asked for.
  const std::vector<int32_t> loop = {1, 2, 1, 2, 1, 2, 1, 2};
  EXPECT_EQ(NgramDraft(loop, Ngram(4, 1, 2), 4), (std::vector<int32_t>{1, 2, 1, 2}));
  // A period-1 loop drafts as many as asked once it is long enough.
  const std::vector<int32_t> same = {9, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(NgramDraft(same, Ngram(3, 1, 2), 3), (std::vector<int32_t>{4, 4, 4}));
}

TEST(NgramDraftTest, NoMatchNoDraftAndNeverPastTheEnd) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  EXPECT_TRUE(NgramDraft(tokens, Ngram(4, 1, 3), 4).empty());
  // The match right before the end: only the tokens that exist follow it.
  const std::vector<int32_t> rep = {5, 5, 5};
  EXPECT_EQ(NgramDraft(rep, Ngram(4, 1, 2), 4), (std::vector<int32_t>{5}));
  // ngram_min above every match length: nothing.
  const std::vector<int32_t> pair = {1, 2, 9, 2};
  EXPECT_TRUE(NgramDraft(pair, Ngram(2, 2, 3), 2).empty());
  EXPECT_EQ(NgramDraft(pair, Ngram(2, 1, 3), 2), (std::vector<int32_t>{9, 2}));
  EXPECT_TRUE(NgramDraft({}, Ngram(2, 1, 3), 2).empty());
  EXPECT_TRUE(NgramDraft(tokens, Ngram(2, 1, 3), 0).empty());
}

TEST(AcceptedDraftLengthTest, LongestPrefixWhereTheTargetAgrees) {
  EXPECT_EQ(AcceptedDraftLength({4, 5, 6}, {4, 5, 6}), 3);
  EXPECT_EQ(AcceptedDraftLength({4, 5, 6}, {4, 9, 6}), 1);
  EXPECT_EQ(AcceptedDraftLength({4, 5, 6}, {1, 5, 6}), 0);
  EXPECT_EQ(AcceptedDraftLength({}, {1}), 0);
}

TEST(SpeculativeConfigTest, ParsesAndValidates) {
  EXPECT_EQ(*ParseSpeculativeMethod("ngram"), SpeculativeMethod::kNgram);
  EXPECT_EQ(*ParseSpeculativeMethod(""), SpeculativeMethod::kNone);
  EXPECT_EQ(*ParseSpeculativeMethod("draft"), SpeculativeMethod::kDraft);
  EXPECT_EQ(*ParseSpeculativeMethod("mtp"), SpeculativeMethod::kMtp);
  EXPECT_FALSE(ParseSpeculativeMethod("eagle").ok());
  EXPECT_TRUE(ValidateSpeculativeConfig(Ngram(4, 1, 4)).ok());
  EXPECT_FALSE(ValidateSpeculativeConfig(Ngram(0, 1, 4)).ok());
  EXPECT_FALSE(ValidateSpeculativeConfig(Ngram(17, 1, 4)).ok());
  EXPECT_FALSE(ValidateSpeculativeConfig(Ngram(2, 3, 2)).ok());
  EXPECT_FALSE(ValidateSpeculativeConfig(Ngram(2, 0, 2)).ok());
  EXPECT_TRUE(ValidateSpeculativeConfig(SpeculativeConfig{}).ok());
}

TEST(DraftLengthTest, BacksOffToPlainDecodingAndProbesWithGrowingPauses) {
  const SpeculativeConfig config = Ngram(3, 1, 4);
  DraftLengthState s;
  EXPECT_EQ(NextDraftLength(config, &s), 3);
  UpdateDraftLength(config, 3, 0, &s);  // nothing accepted: halve
  EXPECT_EQ(NextDraftLength(config, &s), 1);
  // From here every probe fails: pauses of 1, 2, 4, ... plain steps, capped at max_pause_steps.
  std::vector<int64_t> pauses;
  for (int probe = 0; probe < 8; ++probe) {
    UpdateDraftLength(config, 1, 0, &s);
    int64_t plain = 0;
    while (NextDraftLength(config, &s) == 0) ++plain;
    pauses.push_back(plain);
  }
  EXPECT_EQ(pauses, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 32, 32}));
  // A probe accepted: the length grows back to K by one per fully accepted pass, and the next
  // failure pauses for 1 step again.
  UpdateDraftLength(config, 1, 1, &s);
  EXPECT_EQ(NextDraftLength(config, &s), 2);
  UpdateDraftLength(config, 2, 2, &s);
  EXPECT_EQ(NextDraftLength(config, &s), 3);
  UpdateDraftLength(config, 3, 3, &s);
  EXPECT_EQ(NextDraftLength(config, &s), 3);
  UpdateDraftLength(config, 3, 1, &s);  // partly accepted: unchanged
  EXPECT_EQ(NextDraftLength(config, &s), 3);
  UpdateDraftLength(config, 3, 0, &s);
  UpdateDraftLength(config, 1, 0, &s);
  EXPECT_EQ(NextDraftLength(config, &s), 0);
  EXPECT_EQ(NextDraftLength(config, &s), 1);
  // Not adaptive: always K.
  SpeculativeConfig fixed = config;
  fixed.adaptive = false;
  DraftLengthState f;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(NextDraftLength(fixed, &f), 3);
    UpdateDraftLength(fixed, 3, 0, &f);
  }
}

TEST(SpecStatsTest, RatesFromCounters) {
  SpecStats s;
  EXPECT_EQ(s.acceptance_rate(), 0.0);
  EXPECT_EQ(s.mean_accepted_length(), 0.0);
  s.verify_passes = 4;
  s.drafted_tokens = 12;
  s.accepted_tokens = 6;
  EXPECT_DOUBLE_EQ(s.acceptance_rate(), 0.5);
  EXPECT_DOUBLE_EQ(s.mean_accepted_length(), 2.5);
}

}  // namespace
}  // namespace tandem::runtime
