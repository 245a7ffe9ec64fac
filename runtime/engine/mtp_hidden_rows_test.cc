// The MTP layer's compact hidden-state steps (issue 34): ScheduledSeq::zero_hidden_rows (leading
// rows that pair with a zero hidden state and are not sent) and
// SchedulerOutput::return_last_hidden_only (one returned row per sequence):
//  * InputHiddenRuns lays input_hidden's rows over the fed tokens (merging adjacent runs) and
//    refuses rows that do not add up; LastTokenRows names each sequence's last token;
//  * on the CPU MTP executor a compact step (zero rows not sent, last rows returned) gives exactly
//    what the same step with the zero rows written out and every row returned gives: the same
//    sampled tokens and logits, and the returned rows equal to the full step's last rows.
// The CUDA twin: runtime/cuda/cuda_mtp_test.cc (CompactHiddenRowsEqualExplicitZeros).
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/model_executor.h"
#include "runtime/engine/mtp_proposer.h"
#include "runtime/engine/spec_test_util.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

constexpr int64_t kBlockSize = 16;

// Sequences of (zero rows, fed tokens), token ids from `tokens`, one block each.
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<BlockId> blocks;
  SchedulerOutput step;
};

std::unique_ptr<Batch> MakeBatch(const std::vector<std::pair<int64_t, int64_t>>& shape,
                                 int64_t vocab) {
  auto b = std::make_unique<Batch>();
  int64_t total = 0;
  for (const auto& [zero, n] : shape) total += n;
  std::mt19937 rng(11);
  for (int64_t i = 0; i < total; ++i) b->tokens.push_back(static_cast<int32_t>(rng() % vocab));
  for (size_t s = 0; s < shape.size(); ++s) b->blocks.push_back(static_cast<BlockId>(s));
  int64_t t = 0;
  for (size_t s = 0; s < shape.size(); ++s) {
    ScheduledSeq seq;
    seq.request_id = static_cast<int64_t>(s);
    seq.zero_hidden_rows = shape[s].first;
    seq.new_tokens = absl::MakeConstSpan(b->tokens).subspan(t, shape[s].second);
    seq.block_table = absl::MakeConstSpan(b->blocks).subspan(s, 1);
    seq.samples = s % 2 == 0;
    seq.capture_prompt_logits = seq.samples;
    b->step.seqs.push_back(seq);
    t += shape[s].second;
  }
  b->step.num_batched_tokens = total;
  return b;
}

TEST(MtpHiddenRowsTest, RunsMergeAdjacentRowsAndCheckTheCount) {
  constexpr int64_t H = 3;
  std::unique_ptr<Batch> b = MakeBatch({{2, 5}, {0, 3}, {3, 3}, {1, 2}}, 50);
  const std::vector<float> rows(7 * H, 1.5f);  // 3 + 3 + 0 + 1 given rows
  b->step.input_hidden = rows;
  absl::StatusOr<std::vector<HiddenRowRun>> runs = InputHiddenRuns(b->step, H);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 4u);
  auto expect = [&](size_t i, int64_t dst, int64_t src, int64_t n, bool zero) {
    EXPECT_EQ((*runs)[i].dst_row, dst) << i;
    EXPECT_EQ((*runs)[i].rows, n) << i;
    EXPECT_EQ((*runs)[i].zero, zero) << i;
    if (!zero) {
      EXPECT_EQ((*runs)[i].src_row, src) << i;
    }
  };
  expect(0, 0, 0, 2, true);
  expect(1, 2, 0, 6, false);  // sequence 0's last 3 rows and all of sequence 1's
  expect(2, 8, 0, 4, true);   // sequence 2 (all zero) and sequence 3's first row
  expect(3, 12, 6, 1, false);
  EXPECT_EQ(LastTokenRows(b->step), (std::vector<int64_t>{4, 7, 10, 12}));

  b->step.input_hidden = absl::MakeConstSpan(rows).subspan(0, 6 * H);
  EXPECT_EQ(InputHiddenRuns(b->step, H).status().code(), absl::StatusCode::kInvalidArgument);
  b->step.input_hidden = rows;
  b->step.seqs[3].zero_hidden_rows = 3;  // more than its 2 tokens
  EXPECT_EQ(InputHiddenRuns(b->step, H).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MtpHiddenRowsTest, CompactStepEqualsTheStepWithZerosWrittenOut) {
  constexpr int64_t kVocab = 64;
  const ModelConfig model = engine_test::DeepseekMtp(kVocab);
  const int64_t H = model.hidden_size;
  const ModelWeights weights = RandomModelWeights(model, 21);
  const ExecutorSpec spec{.model_config = model,
                          .num_blocks = 8,
                          .block_size = kBlockSize,
                          .max_num_batched_tokens = 64,
                          .max_num_seqs = 8,
                          .max_model_len = 64};
  const std::vector<std::pair<int64_t, int64_t>> shape = {{4, 9}, {0, 5}, {6, 6}, {2, 7}};
  std::unique_ptr<Batch> full = MakeBatch(shape, kVocab);
  std::unique_ptr<Batch> compact = MakeBatch(shape, kVocab);
  // Random target hidden states for the given rows; the full step writes zeros for the others.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> given, written;
  for (const auto& [zero, n] : shape) {
    written.insert(written.end(), static_cast<size_t>(zero * H), 0.0f);
    for (int64_t i = 0; i < (n - zero) * H; ++i) {
      given.push_back(normal(rng));
      written.push_back(given.back());
    }
  }
  for (ScheduledSeq& seq : full->step.seqs) seq.zero_hidden_rows = 0;
  full->step.input_hidden = written;
  full->step.return_hidden_states = true;
  compact->step.input_hidden = given;
  compact->step.return_hidden_states = true;
  compact->step.return_last_hidden_only = true;

  std::vector<RunnerOutput> outs;
  for (const Batch* b : {full.get(), compact.get()}) {
    absl::StatusOr<std::unique_ptr<ModelExecutor>> executor =
        CpuMtpExecutorFactory(1)(spec, RandomMtpWeights(model, weights, 22));
    ASSERT_TRUE(executor.ok()) << executor.status();
    absl::StatusOr<RunnerOutput> out = (*executor)->Run(b->step);
    ASSERT_TRUE(out.ok()) << out.status();
    outs.push_back(*std::move(out));
  }
  const RunnerOutput& a = outs[0];
  const RunnerOutput& c = outs[1];
  EXPECT_EQ(a.sampled_tokens, c.sampled_tokens);
  EXPECT_EQ(a.last_prompt_logits, c.last_prompt_logits);
  ASSERT_EQ(static_cast<int64_t>(a.hidden_states.size()), full->step.num_batched_tokens * H);
  const std::vector<int64_t> last = LastTokenRows(full->step);
  ASSERT_EQ(c.hidden_states.size(), last.size() * static_cast<size_t>(H));
  for (size_t s = 0; s < last.size(); ++s) {
    const std::vector<float> want(a.hidden_states.begin() + last[s] * H,
                                  a.hidden_states.begin() + (last[s] + 1) * H);
    const std::vector<float> got(c.hidden_states.begin() + s * H,
                                 c.hidden_states.begin() + (s + 1) * H);
    EXPECT_EQ(got, want) << "sequence " << s;
  }
  // The zero rows really are zero hidden states: feeding random rows there changes the logits.
  std::vector<float> noisy = written;
  for (int64_t i = 0; i < shape[0].first * H; ++i) noisy[i] = normal(rng);
  full->step.input_hidden = noisy;
  absl::StatusOr<std::unique_ptr<ModelExecutor>> executor =
      CpuMtpExecutorFactory(1)(spec, RandomMtpWeights(model, weights, 22));
  ASSERT_TRUE(executor.ok()) << executor.status();
  absl::StatusOr<RunnerOutput> changed = (*executor)->Run(full->step);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->last_prompt_logits[0], c.last_prompt_logits[0]);
}

}  // namespace
}  // namespace tandem::runtime
