// Block-table deltas (plan_delta.h): over a randomized 1,000-step schedule (admissions, growth,
// skipped steps, preemption and re-admission with other or partly the same blocks, tables
// changed in place, aborts, finishes) the follower's view of every plan, sent as deltas through
// the wire format, equals the whole plan; and the plan's bytes at 64 requests x 32k tokens.
#include "runtime/parallel/plan_delta.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "runtime/parallel/plan_segment.h"

namespace tandem::runtime {
namespace {

std::vector<int32_t> Vec(absl::Span<const int32_t> s) { return {s.begin(), s.end()}; }

// Every field of every sequence, and the batch's own.
void ExpectSameBatch(const SchedulerOutput& got, const SchedulerOutput& want, int step) {
  ASSERT_EQ(got.seqs.size(), want.seqs.size()) << "step " << step;
  EXPECT_EQ(got.num_batched_tokens, want.num_batched_tokens) << "step " << step;
  for (size_t i = 0; i < want.seqs.size(); ++i) {
    const ScheduledSeq& g = got.seqs[i];
    const ScheduledSeq& w = want.seqs[i];
    SCOPED_TRACE(::testing::Message()
                 << "step " << step << " seq " << i << " request " << w.request_id);
    ASSERT_EQ(g.request_id, w.request_id);
    ASSERT_EQ(Vec(g.block_table), Vec(w.block_table));
    EXPECT_EQ(Vec(g.new_tokens), Vec(w.new_tokens));
    EXPECT_EQ(g.num_computed_tokens, w.num_computed_tokens);
    EXPECT_EQ(g.samples, w.samples);
    EXPECT_EQ(g.capture_prompt_logits, w.capture_prompt_logits);
    EXPECT_EQ(g.sampling.temperature, w.sampling.temperature);
    EXPECT_EQ(g.sampling.top_k, w.sampling.top_k);
    EXPECT_EQ(g.sampling.top_p, w.sampling.top_p);
    EXPECT_EQ(g.sampling.seed, w.sampling.seed);
    EXPECT_EQ(g.sampling.vocab_limit, w.sampling.vocab_limit);
    EXPECT_EQ(g.sample_step, w.sample_step);
    EXPECT_EQ(g.num_draft_tokens, w.num_draft_tokens);
  }
}

// A scheduler's block tables as a random process: what the scheduler guarantees is not assumed
// (tables may change in any way), only what it does happens often.
class RandomSchedule {
 public:
  explicit RandomSchedule(uint32_t seed) : rng_(seed) {
    for (int32_t b = 0; b < kPoolBlocks; ++b) free_.push_back(b);
    std::shuffle(free_.begin(), free_.end(), rng_);
  }

  // One step's batch (views into this object: valid until the next call).
  const SchedulerOutput& Next() {
    Admit();
    batch_ = SchedulerOutput();
    std::vector<int64_t> ids;
    for (auto& [id, req] : running_) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    std::shuffle(ids.begin(), ids.end(), rng_);
    for (int64_t id : ids) {
      Request& req = running_[id];
      const double u = Uniform();
      if (u < 0.01) {
        Free(&req.table);  // finished or aborted: gone for good
        running_.erase(id);
        ++counts["end"];
        continue;
      }
      if (u < 0.03) {
        preempted_.push_back({id, req.table});  // its prefix may come back (prefix cache)
        Free(&req.table);
        running_.erase(id);
        ++counts["preempt"];
        continue;
      }
      if (u < 0.07) {
        ++counts["skip"];  // not scheduled this step (token budget)
        continue;
      }
      if (u < 0.08 && req.table.size() > 1) {
        // Changed in place: the last block replaced (copy-on-write) or the table cut.
        if (Uniform() < 0.5) {
          free_.push_back(req.table.back());
          req.table.back() = Take();
        } else {
          req.table.resize(req.table.size() / 2);
        }
        ++counts["rewrite"];
      } else if (u < 0.4) {
        const int grow = 1 + static_cast<int>(Uniform() * 3);
        for (int g = 0; g < grow; ++g) req.table.push_back(Take());
        ++counts["grow"];
      }
      Schedule(id, req);
    }
    return batch_;
  }

  absl::flat_hash_map<std::string, int> counts;

 private:
  static constexpr int32_t kPoolBlocks = 1 << 17;
  struct Request {
    std::vector<int32_t> table;
    std::vector<int32_t> tokens;
  };

  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  int32_t Take() {
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
  }
  void Free(std::vector<int32_t>* table) {
    free_.insert(free_.end(), table->begin(), table->end());
  }

  void Admit() {
    const int admissions = running_.size() < 64 ? static_cast<int>(Uniform() * 3) : 0;
    for (int a = 0; a < admissions; ++a) {
      Request req;
      for (int b = 1 + static_cast<int>(Uniform() * 8); b > 0; --b) req.table.push_back(Take());
      running_[next_id_++] = std::move(req);
      ++counts["admit"];
    }
    if (!preempted_.empty() && Uniform() < 0.3) {
      auto [id, old] = preempted_.front();
      preempted_.erase(preempted_.begin());
      Request req;
      // Back with other blocks, or with its old first blocks (ids that may have been reused
      // meanwhile: only the ids matter here) and new ones after them.
      const size_t keep = Uniform() < 0.5 ? 0 : old.size() / 2;
      req.table.assign(old.begin(), old.begin() + keep);
      for (size_t b = keep; b < std::max<size_t>(old.size(), 1); ++b) req.table.push_back(Take());
      running_[id] = std::move(req);
      ++counts["readmit"];
    }
  }

  void Schedule(int64_t id, Request& req) {
    const int n = Uniform() < 0.8 ? 1 : 2 + static_cast<int>(Uniform() * 30);
    req.tokens.assign(n, 0);
    for (int32_t& t : req.tokens) t = static_cast<int32_t>(Uniform() * 128000);
    ScheduledSeq seq;
    seq.request_id = id;
    seq.new_tokens = req.tokens;
    seq.num_computed_tokens = static_cast<int64_t>(Uniform() * 16 * req.table.size());
    seq.block_table = req.table;
    seq.samples = Uniform() < 0.9;
    seq.capture_prompt_logits = Uniform() < 0.05;
    seq.sampling.temperature = Uniform() < 0.5 ? 0.0f : static_cast<float>(Uniform());
    seq.sampling.top_k = static_cast<int32_t>(Uniform() * 50);
    seq.sampling.top_p = static_cast<float>(Uniform());
    seq.sampling.seed = rng_();
    seq.sampling.vocab_limit = Uniform() < 0.5 ? 0 : 128000;
    seq.sample_step = static_cast<int64_t>(Uniform() * 1000);
    seq.num_draft_tokens = n > 1 && Uniform() < 0.3 ? n - 1 : 0;
    batch_.seqs.push_back(seq);
    batch_.num_batched_tokens += n;
  }

  std::mt19937 rng_;
  std::vector<int32_t> free_;
  absl::flat_hash_map<int64_t, Request> running_;
  std::vector<std::pair<int64_t, std::vector<int32_t>>> preempted_;
  SchedulerOutput batch_;
  int64_t next_id_ = 1;
};

TEST(PlanDeltaTest, DeltasEqualWholePlansOverARandomSchedule) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  RandomSchedule schedule(seed);
  PlanDeltaEncoder encoder;
  PlanDeltaDecoder decoder;
  ReceivedStep got, want;
  int64_t delta_bytes = 0, whole_bytes = 0, deltas = 0, wholes = 0;
  for (int step = 0; step < 1000; ++step) {
    const SchedulerOutput& batch = schedule.Next();
    std::string wire;
    ASSERT_TRUE(encoder.Encode(batch).SerializeToString(&wire));
    tandem::v1::StepPlan received;
    ASSERT_TRUE(received.ParseFromString(wire));
    for (const tandem::v1::PlannedSeq& p : received.seqs()) {
      ++(p.extends_held_table() ? deltas : wholes);
    }
    ASSERT_TRUE(decoder.Apply(std::move(received), &got).ok()) << "step " << step;
    const tandem::v1::StepPlan whole = ToStepPlan(batch);
    ASSERT_TRUE(FromStepPlan(whole, &want).ok());
    ExpectSameBatch(got.batch, want.batch, step);
    ExpectSameBatch(got.batch, batch, step);
    if (HasFatalFailure()) return;
    delta_bytes += static_cast<int64_t>(wire.size());
    whole_bytes += static_cast<int64_t>(whole.ByteSizeLong());
  }
  for (const char* event : {"admit", "grow", "skip", "preempt", "readmit", "rewrite", "end"}) {
    EXPECT_GT(schedule.counts[event], 0) << event << " never happened";
  }
  EXPECT_GT(deltas, 10 * wholes);  // most sequences go as deltas
  EXPECT_LT(delta_bytes, whole_bytes);
  std::printf("1000 steps: %lld sequences as deltas, %lld whole; %lld plan bytes vs %lld whole\n",
              static_cast<long long>(deltas), static_cast<long long>(wholes),
              static_cast<long long>(delta_bytes), static_cast<long long>(whole_bytes));
}

// 64 requests of 32k tokens (block size 16: 2048 blocks each) out of a pool of 131,072 blocks in
// random order: the first plan is whole, every decode step after it fits the shared-memory slot
// by far even when every request starts a new block.
TEST(PlanDeltaTest, SixtyFourRequestsOf32kTokensFitTheSharedMemorySlot) {
  constexpr int kRequests = 64, kBlocks = 2048;
  std::mt19937 rng(11);
  std::vector<int32_t> pool(kRequests * kBlocks + kRequests);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int32_t>(i);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<int32_t>> tables(kRequests);
  std::vector<int32_t> tokens(kRequests);
  for (int r = 0; r < kRequests; ++r) {
    tables[r].assign(pool.begin() + r * kBlocks, pool.begin() + (r + 1) * kBlocks);
    tokens[r] = static_cast<int32_t>(rng() % 128000);
  }
  auto decode_step = [&] {
    SchedulerOutput batch;
    for (int r = 0; r < kRequests; ++r) {
      ScheduledSeq seq;
      seq.request_id = 1000 + r;
      seq.new_tokens = absl::MakeConstSpan(&tokens[r], 1);
      seq.num_computed_tokens = int64_t{16} * static_cast<int64_t>(tables[r].size()) - 1;
      seq.block_table = tables[r];
      seq.samples = true;
      seq.sampling.temperature = 0.8f;
      seq.sampling.top_p = 0.95f;
      seq.sampling.seed = rng();
      seq.sample_step = 300;
      batch.seqs.push_back(seq);
    }
    batch.num_batched_tokens = kRequests;
    return batch;
  };
  PlanDeltaEncoder encoder;
  PlanDeltaDecoder decoder;
  ReceivedStep got;
  const SchedulerOutput first = decode_step();
  const tandem::v1::StepPlan whole = encoder.Encode(first);
  const size_t whole_bytes = whole.ByteSizeLong();
  ASSERT_TRUE(decoder.Apply(whole, &got).ok());
  // Next step: one new token each, and every request starts a new block (the worst case).
  for (int r = 0; r < kRequests; ++r) tables[r].push_back(pool[kRequests * kBlocks + r]);
  const SchedulerOutput second = decode_step();
  const tandem::v1::StepPlan delta = encoder.Encode(second);
  const size_t delta_bytes = delta.ByteSizeLong();
  ASSERT_TRUE(decoder.Apply(delta, &got).ok());
  ReceivedStep want;
  ASSERT_TRUE(FromStepPlan(ToStepPlan(second), &want).ok());
  ExpectSameBatch(got.batch, want.batch, 1);
  const size_t second_whole_bytes = ToStepPlan(second).ByteSizeLong();
  std::printf("64 x 32k tokens: whole plan %zu bytes, delta plan %zu bytes, slot %zu bytes\n",
              second_whole_bytes, delta_bytes, kPlanSlotBytes);
  EXPECT_GT(whole_bytes, kPlanSlotBytes);  // what every step used to send
  EXPECT_GT(second_whole_bytes, kPlanSlotBytes);
  EXPECT_LE(delta_bytes, size_t{4096});  // ~64 bytes a sequence
  EXPECT_EQ(encoder.held_blocks(), int64_t{kRequests} * (kBlocks + 1));
}

TEST(PlanDeltaTest, OutOfStepDeltasAndMalformedPlansAreRefused) {
  std::vector<int32_t> tokens = {3}, table = {7, 8, 9};
  SchedulerOutput batch;
  ScheduledSeq seq;
  seq.request_id = 5;
  seq.new_tokens = tokens;
  seq.block_table = table;
  batch.seqs.push_back(seq);
  PlanDeltaEncoder encoder;
  ASSERT_FALSE(encoder.Encode(batch).seqs(0).extends_held_table());
  const tandem::v1::StepPlan delta = encoder.Encode(batch);
  ASSERT_TRUE(delta.seqs(0).extends_held_table());
  EXPECT_EQ(delta.seqs(0).num_held_blocks(), 3);
  EXPECT_EQ(delta.seqs(0).block_table_size(), 0);
  ReceivedStep got;
  PlanDeltaDecoder fresh;  // holds nothing: the delta cannot be applied
  EXPECT_EQ(fresh.Apply(delta, &got).code(), absl::StatusCode::kFailedPrecondition);
  PlanDeltaDecoder shorter;  // holds a table of another length
  tandem::v1::StepPlan two = ToStepPlan(batch);
  two.mutable_seqs(0)->mutable_block_table()->RemoveLast();
  ASSERT_TRUE(shorter.Apply(two, &got).ok());
  absl::Status s = shorter.Apply(delta, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("holds 2"), std::string::npos) << s;
  tandem::v1::StepPlan twice = ToStepPlan(batch);
  *twice.add_seqs() = twice.seqs(0);
  EXPECT_EQ(PlanDeltaDecoder().Apply(twice, &got).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromStepPlan(delta, &got).code(), absl::StatusCode::kInvalidArgument);
  // After Reset every table goes whole, which a decoder holding anything takes.
  encoder.Reset();
  const tandem::v1::StepPlan again = encoder.Encode(batch);
  EXPECT_FALSE(again.seqs(0).extends_held_table());
  ASSERT_TRUE(shorter.Apply(again, &got).ok());
  EXPECT_EQ(Vec(got.batch.seqs[0].block_table), table);
}

}  // namespace
}  // namespace tandem::runtime
