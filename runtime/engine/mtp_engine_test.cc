// Speculative decoding with DeepSeek-V3's MTP layer (SpeculativeMethod::kMtp) through the CPU
// engine on a tiny random DeepSeek-V3 model (MLA, a dense and a MoE layer, MoE MTP layer), against
// the same engine without speculation:
//  * greedy: token-for-token equal for K = 1, 2, 3 (random MTP weights: low acceptance, exact
//    anyway), under a tight budget with preemption too; every block of both caches returns and
//    the MTP keeps no hidden states of finished requests;
//  * sampling: rejection sampling with the MTP's distributions keeps the target's distribution
//    per position (two-sample chi-square against plain sampling, p > 0.001); a seeded request
//    reproduces its tokens;
//  * a long prompt prefilled in chunks: the MTP holds fewer than kMaxHeldRows hidden states per
//    request between steps;
//  * a P -> D-like request whose prompt hidden states were never computed here (prefix-cache hit)
//    is still exact;
//  * the target returns hidden states only for steps after which some request may draft: none
//    while every request's adaptive draft length pauses, always with a fixed K;
//  * refusals: a non-MLA target, no MTP attached, another method.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/spec_test_util.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

constexpr uint64_t kSeed = 77;

using engine_test::DeepseekMtp;
using Outcome = engine_test::SpecOutcome;
using engine_test::ExpectSameTokens;

EngineConfig Config(int64_t k, bool adaptive = true) {
  EngineConfig c;
  c.num_threads = 1;
  c.kv_cache_bytes = int64_t{4} << 20;  // ~1300 latent blocks (the MTP cache gets as many)
  if (k > 0) {
    c.speculative.method = SpeculativeMethod::kMtp;
    c.speculative.num_speculative_tokens = k;
    c.speculative.adaptive = adaptive;
  }
  return c;
}

Outcome RunAll(const EngineConfig& config, const std::vector<RequestSpec>& specs, int64_t vocab) {
  const ModelConfig model = DeepseekMtp(vocab);
  ModelWeights weights = RandomModelWeights(model, kSeed);
  MtpWeights mtp = RandomMtpWeights(model, weights, kSeed + 1);
  auto engine = Engine::Create(config, model, std::move(weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (config.speculative.method == SpeculativeMethod::kMtp) {
    const absl::Status attached = (*engine)->AttachMtp(model, std::move(mtp));
    EXPECT_TRUE(attached.ok()) << attached;
  }
  const Outcome run = engine_test::RunToCompletion(**engine, specs);
  if (const MtpProposer* m = (*engine)->mtp(); m != nullptr) {
    EXPECT_EQ(m->num_free_blocks(), m->num_blocks()) << "every MTP block must return";
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(m->held_hidden_rows(static_cast<int64_t>(i)), 0) << "request " << i;
    }
  }
  return run;
}

// The requests one after another on one engine (so a later one can hit an earlier one's prefix).
Outcome RunOneByOne(const EngineConfig& config, const std::vector<RequestSpec>& specs,
                    int64_t vocab, int64_t* prefix_hits) {
  const ModelConfig model = DeepseekMtp(vocab);
  ModelWeights weights = RandomModelWeights(model, kSeed);
  MtpWeights mtp = RandomMtpWeights(model, weights, kSeed + 1);
  auto engine = Engine::Create(config, model, std::move(weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (config.speculative.method == SpeculativeMethod::kMtp) {
    EXPECT_TRUE((*engine)->AttachMtp(model, std::move(mtp)).ok());
  }
  Outcome all;
  for (const RequestSpec& spec : specs) {
    Outcome one = engine_test::RunToCompletion(**engine, {spec});
    all.results.push_back(one.results[0]);
    all.stats = one.stats;
  }
  *prefix_hits = (*engine)->kv_cache_stats().prefix_hit_tokens;
  return all;
}

TEST(MtpEngineTest, GreedyIsTokenForTokenThePlainOutput) {
  const std::vector<RequestSpec> specs = engine_test::SpecPrompts(31, 12, 128);
  const Outcome plain = RunAll(Config(0), specs, 128);
  for (int64_t k : {1, 2, 3}) {
    const Outcome spec = RunAll(Config(k, /*adaptive=*/k != 2), specs, 128);
    ExpectSameTokens(plain, spec, "K=" + std::to_string(k));
    EXPECT_GT(spec.stats.drafted_tokens, 0u) << "K=" << k;
  }
}

TEST(MtpEngineTest, GreedyExactUnderATightBudgetAndPreemption) {
  const std::vector<RequestSpec> specs = engine_test::SpecPrompts(37, 10, 128);
  EngineConfig base = Config(0);
  base.max_num_batched_tokens = 12;
  base.kv_cache_bytes = 20 * 16 * 2 * (16 + 8) * 4;  // 20 blocks of 2 latent layers: preemption
  const Outcome plain = RunAll(base, specs, 128);
  EngineConfig config = Config(3, /*adaptive=*/false);
  config.max_num_batched_tokens = base.max_num_batched_tokens;
  config.kv_cache_bytes = base.kv_cache_bytes;
  const Outcome spec = RunAll(config, specs, 128);
  ExpectSameTokens(plain, spec, "tight K=3");
  EXPECT_GT(spec.stats.drafted_tokens, 0u);
}

TEST(MtpEngineTest, RejectionSamplingKeepsTheTargetDistributionPerPosition) {
  constexpr int64_t kVocab = 16;
  constexpr int kSamples = 6000;
  constexpr int kPositions = 3;
  const RequestSpec request = engine_test::RepeatingPromptRequest(kPositions, 0.3f);
  EngineConfig base = Config(0);
  base.max_num_seqs = 1024;
  base.max_num_batched_tokens = 8192;
  const Outcome plain = RunAll(base, engine_test::SeededCopies(request, kSamples, 1), kVocab);
  EngineConfig config = base;
  config.speculative = Config(2, /*adaptive=*/false).speculative;
  const Outcome spec =
      RunAll(config, engine_test::SeededCopies(request, kSamples, 1 + kSamples), kVocab);
  EXPECT_GT(spec.stats.drafted_tokens, 0u);
  EXPECT_GT(spec.stats.accepted_tokens, 0u) << "some MTP drafts must be accepted to test it";
  EXPECT_LT(spec.stats.accepted_tokens, spec.stats.drafted_tokens);
  engine_test::ExpectSameDistributionPerPosition(plain, spec, kVocab, kSamples, kPositions);
}

TEST(MtpEngineTest, SeededSamplingReproduces) {
  RequestSpec request = engine_test::RepeatingPromptRequest(12, 0.8f);
  request.sampling.seed = 1234;
  const std::vector<RequestSpec> specs(2, request);
  const Outcome a = RunAll(Config(3), specs, 64);
  const Outcome b = RunAll(Config(3), specs, 64);
  ExpectSameTokens(a, b, "seeded");
  EXPECT_EQ(a.results[0].tokens, a.results[1].tokens);
}

TEST(MtpEngineTest, PrefixCacheHitWithoutHiddenStatesStaysExact) {
  // The second request's first blocks come from the prefix cache: the target never computes their
  // hidden states, so the MTP sees zeros there (as for a P -> D request's prompt).
  RequestSpec first = engine_test::SpecPrompts(41, 1, 128)[0];
  first.prompt.resize(40, 5);
  first.max_tokens = 8;
  RequestSpec second = first;
  second.prompt.push_back(9);
  second.max_tokens = 16;
  int64_t plain_hits = 0, spec_hits = 0;
  const Outcome plain = RunOneByOne(Config(0), {first, second}, 128, &plain_hits);
  const Outcome spec = RunOneByOne(Config(2), {first, second}, 128, &spec_hits);
  ExpectSameTokens(plain, spec, "prefix hit");
  EXPECT_GE(spec_hits, 32) << "the second request must reuse the first one's blocks";
  EXPECT_GT(spec.stats.drafted_tokens, 0u);
}

// Item 3 of the MTP gaps: a long prompt prefilled in chunks leaves at most kMaxHeldRows
// hidden-state rows per request between steps (the MTP's KV catches up on each chunk instead of
// holding the whole prompt's rows until the first draft), and greedy stays token-for-token the
// plain output.
TEST(MtpEngineTest, LongPromptHiddenStatesStayBounded) {
  std::vector<RequestSpec> specs = engine_test::SpecPrompts(43, 2, 128);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<int32_t> head = specs[i].prompt;
    while (specs[i].prompt.size() < 180 + 10 * i) {
      specs[i].prompt.push_back(head[specs[i].prompt.size() % head.size()]);
    }
    specs[i].max_tokens = 20;
  }
  EngineConfig base = Config(0);
  base.max_num_batched_tokens = 48;
  const Outcome plain = RunAll(base, specs, 128);

  EngineConfig config = Config(3, /*adaptive=*/false);
  config.max_num_batched_tokens = base.max_num_batched_tokens;
  const ModelConfig model = DeepseekMtp(128);
  ModelWeights weights = RandomModelWeights(model, kSeed);
  MtpWeights mtp = RandomMtpWeights(model, weights, kSeed + 1);
  auto engine = Engine::Create(config, model, std::move(weights));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->AttachMtp(model, std::move(mtp)).ok());
  Outcome spec;
  spec.results.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  int64_t most_held = 0;
  for (int guard = 0; (*engine)->HasUnfinished() && guard < 1000; ++guard) {
    auto updates = (*engine)->Step();
    ASSERT_TRUE(updates.ok()) << updates.status();
    for (RequestUpdate& u : *updates) {
      std::vector<int32_t>& tokens = spec.results[u.request_id].tokens;
      tokens.insert(tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t held = (*engine)->mtp()->held_hidden_rows(static_cast<int64_t>(i));
      EXPECT_LT(held, MtpProposer::kMaxHeldRows) << "request " << i << ", step " << guard;
      most_held = std::max(most_held, held);
    }
  }
  EXPECT_FALSE((*engine)->HasUnfinished());
  EXPECT_GT(most_held, 0);
  spec.stats = (*engine)->spec_stats();
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(spec.results[i].tokens, plain.results[i].tokens) << "request " << i;
  }
  EXPECT_GT(spec.stats.drafted_tokens, 0u);
  EXPECT_EQ((*engine)->mtp()->num_free_blocks(), (*engine)->mtp()->num_blocks());
}

// What the engine asked of one target step.
struct StepAsked {
  bool hidden = false;               // SchedulerOutput::return_hidden_states
  std::vector<int64_t> ids;          // the sequences, in batch order
  std::vector<bool> may_draft_next;  // theirs
  std::vector<int64_t> drafts;       // theirs (num_draft_tokens)
};

// The CPU executor, logging every step's StepAsked.
class AskLoggingExecutor : public ModelExecutor {
 public:
  AskLoggingExecutor(std::unique_ptr<ModelExecutor> inner, std::vector<StepAsked>* log)
      : inner_(std::move(inner)), log_(log) {}
  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override {
    StepAsked& step = log_->emplace_back();
    step.hidden = batch.return_hidden_states;
    for (const ScheduledSeq& seq : batch.seqs) {
      step.ids.push_back(seq.request_id);
      step.may_draft_next.push_back(seq.may_draft_next);
      step.drafts.push_back(seq.num_draft_tokens);
    }
    return inner_->Run(batch);
  }
  void* kv_pool_data() override { return inner_->kv_pool_data(); }
  int64_t kv_pool_bytes() const override { return inner_->kv_pool_bytes(); }

 private:
  std::unique_ptr<ModelExecutor> inner_;
  std::vector<StepAsked>* log_;
};

// Runs `specs` with MTP at K = 3 on a logging target executor; `log` gets every target step.
Outcome RunLogged(bool adaptive, const std::vector<RequestSpec>& specs, int64_t vocab,
                  std::vector<StepAsked>* log) {
  const ModelConfig model = DeepseekMtp(vocab);
  ModelWeights weights = RandomModelWeights(model, kSeed);
  MtpWeights mtp = RandomMtpWeights(model, weights, kSeed + 1);
  ExecutorFactory factory = CpuExecutorFactory(1);
  factory.create = [cpu = factory.create, log](
                       const ExecutorSpec& spec,
                       ModelWeights w) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    absl::StatusOr<std::unique_ptr<ModelExecutor>> inner = cpu(spec, std::move(w));
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<ModelExecutor>(new AskLoggingExecutor(*std::move(inner), log));
  };
  auto engine = Engine::Create(Config(3, adaptive), model, std::move(weights), {}, &factory);
  EXPECT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE((*engine)->AttachMtp(model, std::move(mtp)).ok());
  return engine_test::RunToCompletion(**engine, specs);
}

// Issue 34's MTP overhead at acceptance 0: a step after which no request can draft (each one's
// adaptive draft length pauses past the next step) asks for no hidden states (nothing to copy
// back from the device and record), and the step before a probe still gives that request its
// hidden state (the probe's first draft reads it). Greedy stays the plain output.
TEST(MtpEngineTest, NoHiddenStatesForStepsAfterWhichNobodyDrafts) {
  std::vector<RequestSpec> specs = engine_test::SpecPrompts(47, 6, 128);
  for (RequestSpec& spec : specs) {
    spec.max_tokens = 48;
    spec.ignore_eos = true;
  }
  const Outcome plain = RunAll(Config(0), specs, 128);
  std::vector<StepAsked> log;
  const Outcome spec = RunLogged(/*adaptive=*/true, specs, 128, &log);
  ExpectSameTokens(plain, spec, "adaptive K=3");
  ASSERT_GT(spec.stats.drafted_tokens, 0u);
  EXPECT_LT(spec.stats.accepted_tokens * 2, spec.stats.drafted_tokens) << "random MTP weights";
  int64_t without_hidden = 0;
  for (size_t t = 0; t < log.size(); ++t) {
    const StepAsked& step = log[t];
    const bool any = std::find(step.may_draft_next.begin(), step.may_draft_next.end(), true) !=
                     step.may_draft_next.end();
    EXPECT_EQ(step.hidden, any) << "step " << t;
    without_hidden += step.hidden ? 0 : 1;
    if (t == 0) continue;
    // A request drafting now had its hidden state asked for in the step before (if it ran).
    const StepAsked& prev = log[t - 1];
    for (size_t i = 0; i < step.ids.size(); ++i) {
      if (step.drafts[i] == 0) continue;
      const auto it = std::find(prev.ids.begin(), prev.ids.end(), step.ids[i]);
      if (it == prev.ids.end()) continue;
      EXPECT_TRUE(prev.may_draft_next[it - prev.ids.begin()]) << "step " << t << " " << step.ids[i];
      EXPECT_TRUE(prev.hidden) << "step " << t;
    }
  }
  // At acceptance ~0 requests pause for 1, 2, 4 .. steps: most steps read nothing back.
  EXPECT_GT(without_hidden * 3, static_cast<int64_t>(log.size())) << log.size() << " steps";

  // A fixed K drafts at every decode step: every step asks for hidden states, as before.
  log.clear();
  const Outcome fixed = RunLogged(/*adaptive=*/false, specs, 128, &log);
  ExpectSameTokens(plain, fixed, "fixed K=3");
  for (size_t t = 0; t < log.size(); ++t) EXPECT_TRUE(log[t].hidden) << "step " << t;
}

TEST(MtpEngineTest, Refusals) {
  // Not attached yet: requests are refused.
  const ModelConfig model = DeepseekMtp(64);
  auto engine = Engine::Create(Config(2), model, RandomModelWeights(model, kSeed));
  ASSERT_TRUE(engine.ok()) << engine.status();
  RequestSpec spec;
  spec.prompt = {3, 4, 5};
  spec.max_tokens = 4;
  EXPECT_EQ((*engine)->AddRequest(1, spec).code(), absl::StatusCode::kFailedPrecondition);
  // Another method.
  auto ngram = Engine::Create(EngineConfig{}, model, RandomModelWeights(model, kSeed));
  ASSERT_TRUE(ngram.ok());
  const ModelWeights w = RandomModelWeights(model, kSeed);
  EXPECT_EQ((*ngram)->AttachMtp(model, RandomMtpWeights(model, w, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  // A Llama target has no MTP layer.
  const ModelConfig llama = engine_test::TinyConfig(64);
  auto dense = Engine::Create(Config(2), llama, RandomModelWeights(llama, kSeed));
  ASSERT_TRUE(dense.ok());
  const absl::Status refused = (*dense)->AttachMtp(llama, RandomMtpWeights(model, w, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("num_nextn_predict_layers"), std::string::npos) << refused;
}

}  // namespace
}  // namespace tandem::runtime
