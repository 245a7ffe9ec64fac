// EngineLoop admission: handlers never wait for a model step. The engine runs a fake executor
// whose every step takes a fixed time (a sleep), so "the very next step" is a step index the
// loop reports, not a wall-clock bound. Regression tests for the starvation where Submit/Abort
// waited on the lock the loop held across Engine::Step() until the running batch drained.
#include "runtime/worker/engine_loop.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/engine/model_executor.h"
#include "runtime/model/model_config.h"

namespace tandem::runtime {
namespace {

constexpr int32_t kToken = 7;  // what the fake model samples

// Lets a test hold a step in the middle for as long as it likes.
struct StepGate {
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
  int64_t entered ABSL_GUARDED_BY(mu) = 0;  // steps that reached the executor
};

// Sleeps `step_time` per step (and waits for the gate, if any) and samples kToken wherever
// the batch samples.
class SleepingExecutor : public ModelExecutor {
 public:
  SleepingExecutor(const ExecutorSpec& spec, absl::Duration step_time,
                   std::shared_ptr<StepGate> gate)
      : step_time_(step_time),
        gate_(std::move(gate)),
        pool_(static_cast<size_t>(
            spec.num_blocks * spec.block_size * 2 * spec.model_config.num_hidden_layers *
            spec.model_config.num_key_value_heads * spec.model_config.head_dim)) {}

  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override {
    if (gate_ != nullptr) {
      absl::MutexLock lock(&gate_->mu);
      ++gate_->entered;
      gate_->mu.Await(absl::Condition(&gate_->open));
    }
    absl::SleepFor(step_time_);
    RunnerOutput out;
    for (const ScheduledSeq& seq : batch.seqs) {
      out.sampled_tokens.push_back(seq.samples ? kToken : -1);
    }
    out.last_prompt_logits.resize(batch.seqs.size());
    return out;
  }
  void* kv_pool_data() override { return pool_.data(); }
  int64_t kv_pool_bytes() const override {
    return static_cast<int64_t>(pool_.size() * sizeof(float));
  }

 private:
  const absl::Duration step_time_;
  const std::shared_ptr<StepGate> gate_;
  std::vector<float> pool_;
};

struct LoopSetup {
  absl::Duration step_time = absl::Milliseconds(20);
  int64_t max_num_seqs = 256;
  int64_t max_queued_requests = 4096;
  std::shared_ptr<StepGate> gate;
  kvtransfer::PullKvConnector* connector = nullptr;  // attached, and told of orphaned leases
};

std::unique_ptr<EngineLoop> MakeLoop(const LoopSetup& setup) {
  ModelConfig model = *PresetConfig("tiny");
  model.max_position_embeddings = 8192;
  EngineConfig config;
  config.kv_cache_bytes = int64_t{8} << 20;
  config.max_num_seqs = setup.max_num_seqs;
  config.num_threads = 1;
  ExecutorFactory factory;
  factory.name = "sleeping";
  factory.kv_dtype = KvDtype::kF32;
  factory.accepts_external_pool = false;
  factory.create = [setup](const ExecutorSpec& spec,
                           ModelWeights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    return std::make_unique<SleepingExecutor>(spec, setup.step_time, setup.gate);
  };
  auto engine = Engine::Create(config, model, ModelWeights{}, {}, &factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  EngineLoopOptions options;
  options.max_queued_requests = setup.max_queued_requests;
  if (setup.connector != nullptr) {
    (*engine)->AttachConnector(setup.connector);
    options.release_orphan_lease = [c = setup.connector](uint64_t lease) {
      c->ReleaseLease(lease);
    };
  }
  return std::make_unique<EngineLoop>(*std::move(engine), options);
}

RequestSpec Spec(int64_t prompt_len, int64_t max_tokens) {
  RequestSpec spec;
  for (int64_t i = 0; i < prompt_len; ++i) spec.prompt.push_back(static_cast<int32_t>(1 + i % 50));
  spec.max_tokens = max_tokens;
  spec.ignore_eos = true;
  return spec;
}

// The next update, or a test failure after `timeout`.
RequestUpdate NextUpdate(RequestStream& stream, int64_t* step = nullptr,
                         absl::Duration timeout = absl::Seconds(30)) {
  RequestUpdate update;
  EXPECT_TRUE(stream.Next(&update, timeout, step)) << "no update within " << timeout;
  return update;
}

// Waits (bounded) until `pred(loop.Stats())` holds; returns whether it did.
template <typename Pred>
bool WaitForStats(const EngineLoop& loop, Pred pred, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred(loop.Stats())) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred(loop.Stats());
}

TEST(EngineLoopTest, NewRequestRunsInTheNextStepWhileOthersDecode) {
  auto loop = MakeLoop({});
  std::vector<std::shared_ptr<RequestStream>> decoding;
  for (int i = 0; i < 4; ++i) {
    auto stream = loop->Submit(absl::StrCat("long-", i), Spec(32, 4000));
    ASSERT_TRUE(stream.ok()) << stream.status();
    decoding.push_back(*stream);
  }
  for (auto& s : decoding) EXPECT_EQ(NextUpdate(*s).new_token_ids.size(), 1u);

  for (int trial = 0; trial < 5; ++trial) {
    // Seen from the caller: steps completed so far; the one running now is at most before + 1.
    const int64_t before = loop->Stats().steps;
    auto stream = loop->Submit(absl::StrCat("new-", trial), Spec(40, 2));
    ASSERT_TRUE(stream.ok()) << stream.status();
    int64_t step = 0;
    const RequestUpdate first = NextUpdate(**stream, &step);
    ASSERT_EQ(first.new_token_ids.size(), 1u);
    // Queued while step S ran -> in the engine before S + 1, whose prefill samples its token.
    EXPECT_EQ(step, (*stream)->submit_step() + 1) << "trial " << trial;
    EXPECT_LE(step, before + 2) << "trial " << trial << ": Submit waited for steps";
    const RequestUpdate last = NextUpdate(**stream);
    EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  }
  // The long requests kept decoding all along.
  EXPECT_EQ(loop->Stats().num_running, 4);
  EXPECT_EQ(loop->NumInFlight(), 4);
}

TEST(EngineLoopTest, AbortOfADecodingRequestFreesItsBlocksWithinOneStep) {
  auto loop = MakeLoop({});
  // Keeps the loop stepping (prompt of 4 tokens: one block for ~12 more steps).
  auto other = loop->Submit("other", Spec(4, 4000));
  ASSERT_TRUE(other.ok());
  NextUpdate(**other);
  const int64_t free_before = loop->Stats().kv.num_free_blocks;

  auto victim = loop->Submit("victim", Spec(160, 4000));  // 10 full blocks + 1
  ASSERT_TRUE(victim.ok());
  NextUpdate(**victim);
  NextUpdate(**victim);  // decoding now
  EXPECT_LE(loop->Stats().kv.num_free_blocks, free_before - 10);

  const int64_t step_at_abort = loop->Stats().steps;
  ASSERT_TRUE(loop->Abort("victim"));
  EXPECT_FALSE(loop->Abort("victim"));  // gone from the table at once
  // The aborted stream ends without waiting for a step; any token already queued comes first.
  RequestUpdate update;
  do {
    update = NextUpdate(**victim, nullptr, absl::Milliseconds(100));
  } while (update.finish_reason == FinishReason::kNone);
  EXPECT_EQ(update.finish_reason, FinishReason::kAborted);

  // The step running at the abort finishes (<= +1), the next one drops it (+2).
  ASSERT_TRUE(
      WaitForStats(*loop, [&](const EngineLoopStats& s) { return s.steps >= step_at_abort + 2; }));
  const EngineLoopStats after = loop->Stats();
  EXPECT_EQ(after.num_running, 1);
  // "other" may have grown by one block meanwhile.
  EXPECT_GE(after.kv.num_free_blocks, free_before - 1);
  EXPECT_EQ(loop->Stats().requests_aborted, 1u);
  ASSERT_TRUE(loop->Abort("other"));
  EXPECT_TRUE(WaitForStats(*loop, [](const EngineLoopStats& s) {
    return s.num_running == 0 && s.kv.num_free_blocks == s.kv.num_blocks;
  }));
}

TEST(EngineLoopTest, AbortOfAQueuedRequestRemovesIt) {
  LoopSetup setup;
  setup.max_num_seqs = 1;  // one runs, the rest queue
  auto loop = MakeLoop(setup);
  auto running = loop->Submit("running", Spec(8, 4000));
  ASSERT_TRUE(running.ok());
  NextUpdate(**running);

  // Aborted while still in the inbox (right after Submit, during a 20 ms step) or already in
  // the scheduler's waiting queue: either way it is gone and never runs.
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("queued-", i);
    auto queued = loop->Submit(id, Spec(8, 4));
    ASSERT_TRUE(queued.ok());
    if (i % 2 == 1) {
      ASSERT_TRUE(WaitForStats(*loop, [](const EngineLoopStats& s) { return s.num_waiting == 1; }));
      absl::SleepFor(absl::Milliseconds(30));  // past the drain: in the scheduler now
    }
    EXPECT_EQ(loop->Stats().num_waiting, 1);
    EXPECT_EQ(loop->NumInFlight(), 2);
    ASSERT_TRUE(loop->Abort(id));
    const RequestUpdate last = NextUpdate(**queued, nullptr, absl::Milliseconds(100));
    EXPECT_EQ(last.finish_reason, FinishReason::kAborted);
    EXPECT_TRUE(last.new_token_ids.empty());
    EXPECT_EQ(loop->NumInFlight(), 1);
    const int64_t step_at_abort = loop->Stats().steps;
    ASSERT_TRUE(WaitForStats(
        *loop, [&](const EngineLoopStats& s) { return s.steps >= step_at_abort + 2; }));
    EXPECT_EQ(loop->Stats().num_waiting, 0);
    EXPECT_EQ(loop->Stats().num_running, 1);
    RequestUpdate none;
    EXPECT_FALSE((*queued)->Next(&none, absl::ZeroDuration()));  // nothing after the abort
  }
}

TEST(EngineLoopTest, FullQueueAnswersResourceExhausted) {
  LoopSetup setup;
  setup.max_num_seqs = 1;
  setup.max_queued_requests = 3;
  auto loop = MakeLoop(setup);
  auto running = loop->Submit("running", Spec(8, 4000));
  ASSERT_TRUE(running.ok());
  NextUpdate(**running);  // running, so not queued

  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(loop->Submit(absl::StrCat("q", i), Spec(8, 4)).ok()) << i;
  }
  const int64_t free_blocks = loop->Stats().kv.num_free_blocks;
  auto refused = loop->Submit("one-too-many", Spec(8, 4));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("limit 3"), std::string::npos) << refused.status();
  EXPECT_FALSE(loop->Abort("one-too-many"));  // nothing of it was kept
  EXPECT_EQ(loop->NumInFlight(), 4);
  EXPECT_EQ(loop->Stats().kv.num_free_blocks, free_blocks);

  // Room again once one has left the queue (at the next step).
  ASSERT_TRUE(loop->Abort("q0"));
  ASSERT_TRUE(WaitForStats(*loop, [](const EngineLoopStats& s) { return s.num_waiting == 2; }));
  EXPECT_TRUE(loop->Submit("fits-now", Spec(8, 4)).ok());
  // Bad input is refused before the queue is consulted, without touching it.
  auto bad = loop->Submit("bad", Spec(0, 4));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineLoopTest, SixteenSubmittersAreEachAdmittedWithinTwoSteps) {
  LoopSetup setup;
  setup.step_time = absl::Milliseconds(2);
  auto loop = MakeLoop(setup);
  // The loop never idles: a long request decodes for the whole test.
  auto busy = loop->Submit("busy", Spec(8, 7000));
  ASSERT_TRUE(busy.ok());
  NextUpdate(**busy);

  constexpr int kThreads = 16;
  constexpr int kPerThread = 8;
  absl::Mutex mu;
  std::vector<int64_t> lags;  // first-token step - submit step
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto stream = loop->Submit(absl::StrCat("t", t, "-", i), Spec(8 + t, 2));
        if (!stream.ok()) {
          ++errors;
          continue;
        }
        RequestUpdate update;
        int64_t step = 0;
        if (!(*stream)->Next(&update, absl::Seconds(30), &step) || update.new_token_ids.empty()) {
          ++errors;
          continue;
        }
        while (update.finish_reason == FinishReason::kNone &&
               (*stream)->Next(&update, absl::Seconds(30))) {
        }
        absl::MutexLock lock(&mu);
        lags.push_back(step - (*stream)->submit_step());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_EQ(lags.size(), static_cast<size_t>(kThreads * kPerThread));
  for (int64_t lag : lags) {
    EXPECT_GE(lag, 1);
    EXPECT_LE(lag, 2);
  }
  EXPECT_EQ(loop->Stats().num_running, 1);  // "busy" still decoding
}

TEST(EngineLoopTest, HandlersNeverWaitForARunningStep) {
  LoopSetup setup;
  setup.step_time = absl::ZeroDuration();
  setup.gate = std::make_shared<StepGate>();
  auto loop = MakeLoop(setup);
  // Long enough that it is still running when the gate closes, however slowly this thread runs
  // (with zero step time, 100 tokens could all be generated before; then no step ever entered).
  auto running = loop->Submit("running", Spec(8, 8000));
  ASSERT_TRUE(running.ok());
  NextUpdate(**running);
  {
    absl::MutexLock lock(&setup.gate->mu);
    setup.gate->open = false;
    const int64_t entered = setup.gate->entered;
    auto in_step = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(setup.gate->mu) {
      return setup.gate->entered > entered;
    };
    ASSERT_TRUE(setup.gate->mu.AwaitWithTimeout(absl::Condition(&in_step), absl::Seconds(30)))
        << "no step entered the model";
  }
  // A step is stuck inside the model now. Every handler-facing call must still return.
  absl::Notification done;
  std::shared_ptr<RequestStream> queued;
  std::thread caller([&] {
    loop->Stats();
    loop->CachedHashes();
    std::vector<uint64_t> added, removed;
    loop->TakeCacheEvents(&added, &removed);
    loop->NumInFlight();
    auto stream = loop->Submit("while-stepping", Spec(4, 2));
    if (stream.ok()) queued = *stream;
    loop->Submit("aborted-while-stepping", Spec(4, 2)).IgnoreError();
    loop->Abort("aborted-while-stepping");
    done.Notify();
  });
  const bool returned = done.WaitForNotificationWithTimeout(absl::Seconds(20));
  {
    absl::MutexLock lock(&setup.gate->mu);
    setup.gate->open = true;
  }
  caller.join();
  ASSERT_TRUE(returned) << "a handler call waited for the running step";
  ASSERT_NE(queued, nullptr);
  int64_t step = 0;
  EXPECT_EQ(NextUpdate(*queued, &step).new_token_ids.size(), 1u);
  EXPECT_EQ(step, queued->submit_step() + 1);
  EXPECT_EQ(NextUpdate(*queued).finish_reason, FinishReason::kLength);
}

TEST(EngineLoopTest, ALeaseGrantedToARequestAbortedDuringItsLastStepIsReleasedAtOnce) {
  // P side: the request finishes (its KV held for a reader, lease granted) in the very step
  // during which the caller aborted it. Its handle will never reach a reader.
  auto fabric = std::make_shared<kvtransfer::InProcessFabric>();
  kvtransfer::InProcessAgent agent(fabric, "p0");
  kvtransfer::PullKvConnectorOptions copts;
  copts.block_bytes = 1;
  kvtransfer::PullKvConnector connector(&agent, copts);
  LoopSetup setup;
  setup.step_time = absl::ZeroDuration();
  setup.gate = std::make_shared<StepGate>();
  setup.connector = &connector;
  auto loop = MakeLoop(setup);
  const int64_t total = loop->Stats().kv.num_blocks;
  {
    absl::MutexLock lock(&setup.gate->mu);
    setup.gate->open = false;
  }
  RequestSpec spec = Spec(40, 1);
  spec.hold_kv_for_remote = true;
  spec.lease_duration = absl::Seconds(30);
  auto held = loop->Submit("held", spec);
  ASSERT_TRUE(held.ok()) << held.status();
  {
    absl::MutexLock lock(&setup.gate->mu);
    auto in_step = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(setup.gate->mu) {
      return setup.gate->entered > 0;
    };
    setup.gate->mu.Await(absl::Condition(&in_step));
  }
  ASSERT_TRUE(loop->Abort("held"));  // during the step that grants the lease
  // The gated step has not published its snapshot yet.
  const int64_t steps_before = loop->Stats().steps;
  {
    absl::MutexLock lock(&setup.gate->mu);
    setup.gate->open = true;
  }
  // Released at once (not after 30 s), so the blocks come back at the next idle poll. (After
  // the gated step: a snapshot published before it has every block free too.)
  ASSERT_TRUE(WaitForStats(
      *loop,
      [&](const EngineLoopStats& s) {
        return s.steps > steps_before && s.kv.num_free_blocks == total;
      },
      absl::Seconds(10)));
  // Whether the lease was granted before the abort reached the engine depends on where the
  // step was when the abort landed (a fresh-clone CI run under load saw the abort win once):
  // either no lease was ever granted, or the one granted was released. Never one left active.
  const kvtransfer::KvConnectorStats stats = connector.Stats();
  EXPECT_LE(stats.leases_granted, 1u);
  EXPECT_EQ(stats.leases_released, stats.leases_granted);
  EXPECT_EQ(stats.leases_active, 0u);
}

}  // namespace
}  // namespace tandem::runtime
