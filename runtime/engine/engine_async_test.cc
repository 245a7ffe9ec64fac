// Async scheduling (EngineConfig::async_scheduling) on the CPU backend, whose executor runs the
// same Launch / Collect protocol as the CUDA one (ModelExecutor's default: the previous step's
// tokens substituted on the host): token-identical to synchronous steps over random schedules
// (arrivals, chunked prefill, preemption, prefix hits, greedy and seeded sampling, captured
// prompt logits), stops that only the late token shows, and aborts while a step is in flight.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

using engine_test::TinyConfig;

// The CPU executor, counting the sequences whose fed token came from the previous step.
class CountingExecutor : public ModelExecutor {
 public:
  CountingExecutor(std::unique_ptr<ModelExecutor> inner, int64_t* fed_from_prev)
      : inner_(std::move(inner)), fed_from_prev_(fed_from_prev) {}
  absl::Status Launch(const SchedulerOutput& batch) override {
    for (const ScheduledSeq& seq : batch.seqs) *fed_from_prev_ += seq.input_from_prev_seq >= 0;
    return ModelExecutor::Launch(batch);  // substitutes the tokens, then Run()
  }
  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override {
    for (const ScheduledSeq& seq : batch.seqs) EXPECT_LT(seq.input_from_prev_seq, 0);
    return inner_->Run(batch);
  }
  void* kv_pool_data() override { return inner_->kv_pool_data(); }
  int64_t kv_pool_bytes() const override { return inner_->kv_pool_bytes(); }

 private:
  std::unique_ptr<ModelExecutor> inner_;
  int64_t* fed_from_prev_;
};

// A fresh seed per run; TANDEM_TEST_SEED replays one.
uint32_t TestSeed() {
  const char* env = std::getenv("TANDEM_TEST_SEED");
  return env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                        : std::random_device{}();
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  FinishReason reason = FinishReason::kNone;
};

struct Schedule {
  std::vector<RequestSpec> specs;
  std::vector<int> arrival;              // step before which request i is added
  std::multimap<int, int64_t> abort_at;  // step -> request aborted before it
};

// Runs `schedule` to completion; checks the protocol (nothing after a finish or an abort, every
// block back in the pool) on the way.
std::vector<Result> Drive(EngineConfig config, const Schedule& schedule, bool async,
                          int64_t* fed_from_prev = nullptr) {
  config.async_scheduling = async;
  const ModelConfig model = TinyConfig();
  int64_t fed = 0;
  const ExecutorFactory cpu = CpuExecutorFactory(1);
  ExecutorFactory counting = cpu;
  counting.create = [&cpu, &fed](
                        const ExecutorSpec& spec,
                        ModelWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    auto inner = cpu.create(spec, std::move(weights));
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<ModelExecutor>(new CountingExecutor(*std::move(inner), &fed));
  };
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 77), {}, &counting);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  Engine& e = **engine;
  EXPECT_EQ(e.async_scheduling(), async);
  const int n = static_cast<int>(schedule.specs.size());
  std::vector<Result> results(n);
  std::vector<bool> done(n, false);
  int added = 0;
  for (int step = 0; step < 5000 && (added < n || e.HasUnfinished()); ++step) {
    for (int i = 0; i < n; ++i) {
      if (schedule.arrival[i] != step) continue;
      const absl::Status added_status = e.AddRequest(i, schedule.specs[i]);
      EXPECT_TRUE(added_status.ok()) << added_status;
      ++added;
    }
    for (auto [a, end] = schedule.abort_at.equal_range(step); a != end; ++a) {
      EXPECT_FALSE(done[a->second]) << "request " << a->second << " ended before its abort";
      EXPECT_TRUE(e.Abort(a->second));
      done[a->second] = true;
      results[a->second].reason = FinishReason::kAborted;
    }
    auto updates = e.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      EXPECT_FALSE(done[u.request_id]) << "update after request " << u.request_id << " ended";
      Result& r = results[u.request_id];
      r.tokens.insert(r.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      EXPECT_EQ(u.num_output_tokens, static_cast<int64_t>(r.tokens.size()));
      if (!u.last_prompt_logits.empty()) r.logits = std::move(u.last_prompt_logits);
      if (u.finish_reason != FinishReason::kNone) {
        r.reason = u.finish_reason;
        done[u.request_id] = true;
      }
    }
  }
  EXPECT_FALSE(e.HasUnfinished());
  EXPECT_EQ(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks())
      << "every block must return to the pool";
  if (fed_from_prev != nullptr) *fed_from_prev = fed;
  return results;
}

void ExpectSame(const std::vector<Result>& a, const std::vector<Result>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ": request " << i;
    EXPECT_EQ(a[i].reason, b[i].reason) << what << ": request " << i;
    ASSERT_EQ(a[i].logits.size(), b[i].logits.size()) << what << ": request " << i;
    float max_abs = 0, max_diff = 0;
    for (size_t v = 0; v < a[i].logits.size(); ++v) {
      max_abs = std::max(max_abs, std::fabs(a[i].logits[v]));
      max_diff = std::max(max_diff, std::fabs(a[i].logits[v] - b[i].logits[v]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_abs + 1e-5f) << what << ": request " << i;
  }
}

// Random requests: shared prefixes, greedy and seeded sampling, some capturing prompt logits,
// arriving over the first steps.
Schedule RandomSchedule(std::mt19937& rng, int n) {
  Schedule s;
  std::vector<int32_t> shared(20);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % 256);
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    if (rng() % 3 == 0) spec.prompt.assign(shared.begin(), shared.begin() + 1 + rng() % 20);
    const int len = 1 + static_cast<int>(rng() % 30);
    for (int t = 0; t < len; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
    spec.max_tokens = 1 + static_cast<int>(rng() % 20);
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = rng() % 4 == 0;
    if (rng() % 2 == 0) {
      spec.sampling.temperature = 0.9f;
      spec.sampling.top_k = 40;
      spec.sampling.seed = 100 + i;
    }
    s.specs.push_back(std::move(spec));
    s.arrival.push_back(static_cast<int>(rng() % 12));
  }
  return s;
}

// Makes half of the requests stop at a token they generate (found by a synchronous run), so
// stops land on steps whose token the async engine learns one step late.
void AddStops(std::mt19937& rng, const std::vector<Result>& free_run, Schedule* s) {
  for (size_t i = 0; i < s->specs.size(); ++i) {
    if (rng() % 2 == 0 || free_run[i].tokens.size() < 2) continue;
    const int32_t stop = free_run[i].tokens[rng() % free_run[i].tokens.size()];
    s->specs[i].stop_token_ids = {stop};
  }
}

TEST(EngineAsyncTest, RandomSchedulesGiveTheSameTokensAsSynchronousSteps) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  EngineConfig roomy;
  EngineConfig tight;  // chunked prefill and preemption: steps that run synchronously
  tight.kv_cache_bytes = 7 * KvBlockBytes(TinyConfig(), tight.block_size, KvDtype::kF32);
  tight.max_num_batched_tokens = 24;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    Schedule schedule = RandomSchedule(rng, 8);
    AddStops(rng, Drive(roomy, schedule, /*async=*/false), &schedule);
    for (const EngineConfig& config : {roomy, tight}) {
      const std::vector<Result> sync = Drive(config, schedule, false);
      int64_t fed = 0;
      ExpectSame(sync, Drive(config, schedule, true, &fed), "async vs sync");
      EXPECT_GT(fed, 0) << "no step fed a token from the step before";
    }
  }
}

TEST(EngineAsyncTest, AStopSeenOneStepLateEmitsNothingMoreAndFreesItsBlocks) {
  Schedule schedule;
  RequestSpec spec;
  spec.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  spec.max_tokens = 12;
  spec.ignore_eos = true;
  schedule.specs = {spec, spec};
  schedule.specs[1].prompt.push_back(5);
  schedule.arrival = {0, 0};
  EngineConfig config;
  const std::vector<Result> free_run = Drive(config, schedule, false);
  ASSERT_EQ(free_run[0].tokens.size(), 12u);
  // Request 0 stops at its 4th token (its first occurrence); request 1 keeps going, reusing
  // blocks request 0 held.
  const int32_t stop = free_run[0].tokens[3];
  schedule.specs[0].stop_token_ids = {stop};
  const auto first = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), stop);
  const std::vector<int32_t> expected(free_run[0].tokens.begin(), first + 1);
  for (bool async : {false, true}) {
    const std::vector<Result> r = Drive(config, schedule, async);
    EXPECT_EQ(r[0].tokens, expected) << "async " << async;
    EXPECT_EQ(r[0].reason, FinishReason::kStopToken);
    EXPECT_EQ(r[1].tokens, free_run[1].tokens) << "async " << async;
  }
}

TEST(EngineAsyncTest, AbortWhileItsStepIsInFlight) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  Schedule schedule = RandomSchedule(rng, 6);
  for (RequestSpec& spec : schedule.specs) spec.max_tokens = 16;
  const std::vector<Result> sync = Drive(EngineConfig{}, schedule, false);
  // Abort two requests mid-generation: the others are unchanged, the aborted ones emitted a
  // prefix of their tokens, and every block comes back (Drive checks).
  // Steps counted from each request's arrival: a request arriving at step a has emitted at most
  // 1 + (s - a) of its 16 tokens before step s, so both are still running when aborted (a fixed
  // step raced with early arrivals finishing first).
  schedule.abort_at = {{schedule.arrival[1] + 5, 1}, {schedule.arrival[4] + 8, 4}};
  const std::vector<Result> r = Drive(EngineConfig{}, schedule, true);
  for (size_t i = 0; i < r.size(); ++i) {
    if (i == 1 || i == 4) {
      EXPECT_EQ(r[i].reason, FinishReason::kAborted);
      ASSERT_LE(r[i].tokens.size(), sync[i].tokens.size());
      EXPECT_TRUE(std::equal(r[i].tokens.begin(), r[i].tokens.end(), sync[i].tokens.begin()));
      continue;
    }
    EXPECT_EQ(r[i].tokens, sync[i].tokens) << "request " << i;
  }
}

TEST(EngineAsyncTest, AnAbortedIdComesBackOnceItsStepEnded) {
  const ModelConfig model = TinyConfig();
  EngineConfig config;
  config.async_scheduling = true;
  auto engine = Engine::Create(config, model, RandomModelWeights(model, 3));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  RequestSpec spec;
  spec.prompt.assign(40, 7);
  spec.max_tokens = 100;
  spec.ignore_eos = true;
  ASSERT_TRUE(e.AddRequest(1, spec).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e.Step().ok());
  EXPECT_TRUE(e.Abort(1));
  EXPECT_FALSE(e.Abort(1));
  // Its launched step still writes its KV: the blocks (and the id) wait for that step.
  EXPECT_LT(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
  EXPECT_EQ(e.AddRequest(1, spec).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(e.HasUnfinished());
  auto updates = e.Step();
  ASSERT_TRUE(updates.ok());
  EXPECT_TRUE(updates->empty());
  EXPECT_FALSE(e.HasUnfinished());
  EXPECT_EQ(e.kv_cache_stats().num_free_blocks, e.num_kv_blocks());
  EXPECT_TRUE(e.AddRequest(1, spec).ok());
}

}  // namespace
}  // namespace tandem::runtime
