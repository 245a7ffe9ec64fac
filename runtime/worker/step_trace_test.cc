// The step record's parts: ShapeOf (what a scheduled batch fed), the JSON-lines writer (lines,
// the bound on them, a path it cannot create) and the step histograms (decode-only steps apart
// from steps with prompt tokens).
#include "runtime/worker/step_trace.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(StepShapeTest, CountsDecodesPromptTokensAndDrafts) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    // Random batches of decodes (one fed token after some context), decodes with drafts, and
    // prompt chunks (several fed tokens, or one at position 0).
    const int n = 1 + static_cast<int>(rng() % 8);
    std::vector<std::vector<int32_t>> tokens(n);
    SchedulerOutput batch;
    StepShape want;
    for (int i = 0; i < n; ++i) {
      ScheduledSeq seq;
      const int kind = static_cast<int>(rng() % 4);
      const int64_t drafts = kind == 1 ? 1 + rng() % 4 : 0;
      const int64_t fed = kind >= 2 ? 1 + rng() % 300 : 1;
      tokens[i].assign(static_cast<size_t>(fed + drafts), 5);
      seq.new_tokens = tokens[i];
      seq.num_draft_tokens = drafts;
      seq.num_computed_tokens = kind == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 1000);
      const bool decodes = fed == 1 && seq.num_computed_tokens > 0;
      want.decode_seqs += decodes ? 1 : 0;
      want.prefill_tokens += decodes ? 0 : fed;
      want.draft_tokens += drafts;
      batch.num_batched_tokens += fed + drafts;
      batch.seqs.push_back(seq);
    }
    const StepShape got = ShapeOf(batch);
    EXPECT_EQ(got.seqs, n);
    EXPECT_EQ(got.decode_seqs, want.decode_seqs) << "trial " << trial;
    EXPECT_EQ(got.prefill_tokens, want.prefill_tokens) << "trial " << trial;
    EXPECT_EQ(got.draft_tokens, want.draft_tokens) << "trial " << trial;
    EXPECT_EQ(got.tokens, batch.num_batched_tokens);
    EXPECT_EQ(got.has_prefill(), want.decode_seqs < n);
  }
}

TEST(StepTraceWriterTest, WritesOneLineAStepAndStopsAtItsBound) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/steps.jsonl");
  {
    auto writer = StepTraceWriter::Open(path, /*max_lines=*/3);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < 5; ++i) {
      StepRecord r;
      r.step = 10 + i;
      r.start = t0 + absl::Milliseconds(4 * i);
      r.wall = absl::Microseconds(3000 + i);
      r.gap = absl::Microseconds(40 + i);
      r.shape = {.seqs = 3,
                 .decode_seqs = 2,
                 .prefill_tokens = 17 + i,
                 .draft_tokens = 0,
                 .tokens = 19 + i};
      r.running = 3;
      r.waiting = i;
      (*writer)->Write(r);
    }
  }
  const std::vector<std::string> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i].rfind(absl::StrCat("{\"step\":", 10 + i, ",\"t_us\":"), 0), 0u) << lines[i];
    EXPECT_NE(lines[i].find(absl::StrCat(",\"step_us\":", 3000 + i, ",\"gap_us\":", 40 + i,
                                         ",\"seqs\":3,\"decode\":2,\"prefill_tokens\":", 17 + i,
                                         ",\"draft_tokens\":0,\"tokens\":", 19 + i,
                                         ",\"running\":3,\"waiting\":", i, "}")),
              std::string::npos)
        << lines[i];
  }
  EXPECT_EQ(lines[3], "{\"truncated_after\":3}");
}

TEST(StepTraceWriterTest, RefusesAPathItCannotCreateAndANonPositiveBound) {
  auto missing = StepTraceWriter::Open(absl::StrCat(::testing::TempDir(), "/nope/s.jsonl"), 10);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("nope/s.jsonl"), std::string::npos) << missing.status();
  auto zero = StepTraceWriter::Open(absl::StrCat(::testing::TempDir(), "/z.jsonl"), 0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument) << zero.status();
}

TEST(StepMetricsTest, SortsStepsByKind) {
  StepMetrics metrics;
  std::mt19937 rng(5);
  int64_t decode = 0, prefill = 0, tokens = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  for (int i = 0; i < 200; ++i) {
    StepRecord r;
    r.shape.seqs = 1 + static_cast<int64_t>(rng() % 6);
    r.shape.decode_seqs = static_cast<int64_t>(rng() % (r.shape.seqs + 1));
    r.shape.tokens = r.shape.decode_seqs + (r.shape.has_prefill() ? 1 + rng() % 4000 : 0);
    r.wall = absl::Microseconds(200 + rng() % 50000);
    (r.shape.has_prefill() ? prefill : decode) += 1;
    (r.shape.has_prefill() ? prefill_seconds : decode_seconds) += absl::ToDoubleSeconds(r.wall);
    tokens += r.shape.tokens;
    metrics.Observe(r);
  }
  const StepMetrics::Snapshot s = metrics.Take();
  EXPECT_EQ(s.decode_seconds.count, static_cast<uint64_t>(decode));
  EXPECT_EQ(s.prefill_seconds.count, static_cast<uint64_t>(prefill));
  EXPECT_NEAR(s.decode_seconds.sum, decode_seconds, 1e-9);
  EXPECT_NEAR(s.prefill_seconds.sum, prefill_seconds, 1e-9);
  EXPECT_EQ(s.tokens.count, 200u);
  EXPECT_DOUBLE_EQ(s.tokens.sum, static_cast<double>(tokens));
  EXPECT_GT(decode, 0);
  EXPECT_GT(prefill, 0);
}

}  // namespace
}  // namespace tandem::runtime
