// MTP drafting on a P -> D decode worker (issue 34): a P engine and a D engine, both with the MTP
// layer attached, joined by PullKvConnectors over InProcessAgents (as disagg_engine_test). P runs
// the MTP over each prompt and hands its latent rows and h_{L-1} over with the lease
// (RequestUpdate::mtp_handoff -> RequestSpec::mtp_handoff); D's MTP then drafts exactly what a
// mixed engine's drafts: the same verify passes, drafts and accepted drafts (a small vocabulary,
// repetitive prompts and an MTP layer whose drafts follow the target's hidden states more than
// the next token's embedding, so that drafts are accepted and the counts see the hidden states),
// and the same tokens (seeded sampled requests too: rejection sampling saw the same drafts).
// Without the handoff D is still exact but drafts otherwise (the zero hidden states of before). A
// handoff of another shape is refused by name; an engine without MTP ignores it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/mtp_proposer.h"
#include "runtime/engine/spec_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

using engine_test::DeepseekMtp;
using kvtransfer::InProcessAgent;
using kvtransfer::InProcessFabric;
using kvtransfer::PullKvConnector;

constexpr uint64_t kSeed = 77;
constexpr int64_t kVocab = 16;

EngineConfig Config(int64_t k) {
  EngineConfig c;
  c.num_threads = 1;
  c.kv_cache_bytes = int64_t{2} << 20;
  if (k > 0) {
    c.speculative.method = SpeculativeMethod::kMtp;
    c.speculative.num_speculative_tokens = k;
    c.speculative.adaptive = false;
  }
  return c;
}

std::unique_ptr<Engine> MakeEngine(int64_t k) {
  const ModelConfig model = DeepseekMtp(kVocab);
  ModelWeights weights = RandomModelWeights(model, kSeed);
  MtpWeights mtp = RandomMtpWeights(model, weights, kSeed + 1);
  // The next token's embedding weighs little: the drafts follow the target's hidden states.
  for (float& w : mtp.enorm) w *= 0.05f;
  auto engine = Engine::Create(Config(k), model, std::move(weights));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (k > 0) {
    EXPECT_TRUE((*engine)->AttachMtp(model, std::move(mtp)).ok());
  }
  return std::move(*engine);
}

struct Node {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<InProcessAgent> agent;
  std::unique_ptr<PullKvConnector> connector;
};

Node MakeNode(std::shared_ptr<InProcessFabric> fabric, const std::string& name, int64_t k) {
  Node node;
  node.engine = MakeEngine(k);
  node.agent = std::make_unique<InProcessAgent>(fabric, name);
  EXPECT_TRUE(node.agent
                  ->RegisterMemory(node.engine->kv_pool_data(), node.engine->kv_pool_bytes(),
                                   tandem::v1::MEMORY_KIND_HOST)
                  .ok());
  kvtransfer::PullKvConnectorOptions options;
  options.block_size = node.engine->block_size();
  options.block_bytes = node.engine->kv_block_bytes();
  node.connector = std::make_unique<PullKvConnector>(node.agent.get(), options);
  node.engine->AttachConnector(node.connector.get());
  return node;
}

// Steps until no work is left; the updates per request id, joined.
std::map<int64_t, RequestUpdate> Drain(Engine& engine) {
  std::map<int64_t, RequestUpdate> out;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (engine.HasWork() && absl::Now() < give_up) {
    auto updates = engine.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    if (updates->empty()) absl::SleepFor(absl::Microseconds(50));
    for (RequestUpdate& u : *updates) {
      RequestUpdate& o = out[u.request_id];
      o.new_token_ids.insert(o.new_token_ids.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (u.finish_reason != FinishReason::kNone) o.finish_reason = u.finish_reason;
      if (u.kv_lease.has_value()) o.kv_lease = std::move(u.kv_lease);
      if (u.mtp_handoff.has_value()) o.mtp_handoff = std::move(u.mtp_handoff);
    }
  }
  EXPECT_FALSE(engine.HasWork());
  return out;
}

// Greedy prompts (even ones repetitive) and two seeded sampled ones.
std::vector<RequestSpec> Specs() {
  std::vector<RequestSpec> specs = engine_test::SpecPrompts(53, 10, kVocab);
  for (RequestSpec& spec : specs) spec.ignore_eos = true;
  for (int i : {4, 7}) {
    specs[i].sampling.temperature = 0.7f;
    specs[i].sampling.seed = 900 + i;
  }
  return specs;
}

struct PdRun {
  engine_test::SpecOutcome out;
  std::vector<std::optional<MtpHandoff>> handoffs;
};

// P prefills every request holding its KV; D decodes them, with P's MTP handoffs or without.
PdRun RunPrefillDecode(const std::vector<RequestSpec>& specs, bool hand_over) {
  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p", 2), d = MakeNode(fabric, "d", 2);
  tandem::v1::TransferHandshake hs;
  EXPECT_TRUE(p.agent->FillLocalDescriptor(&hs).ok());
  EXPECT_TRUE(d.agent->AddPeer("p", hs).ok());
  for (size_t i = 0; i < specs.size(); ++i) {
    RequestSpec spec = specs[i];
    spec.max_tokens = 1;
    spec.hold_kv_for_remote = true;
    EXPECT_TRUE(p.engine->AddRequest(static_cast<int64_t>(i), spec).ok());
  }
  std::map<int64_t, RequestUpdate> prefilled = Drain(*p.engine);
  EXPECT_EQ(p.engine->spec_stats().drafted_tokens, 0u) << "P never drafts";
  PdRun run;
  for (size_t i = 0; i < specs.size(); ++i) {
    RequestUpdate& first = prefilled[static_cast<int64_t>(i)];
    EXPECT_TRUE(first.kv_lease.has_value()) << "request " << i;
    if (!first.kv_lease.has_value()) continue;
    run.handoffs.push_back(first.mtp_handoff);
    RequestSpec spec = specs[i];
    spec.first_token = first.new_token_ids.at(0);
    kvtransfer::RemoteKvSpec remote;
    remote.peer = "p";
    remote.block_ids = first.kv_lease->block_ids;
    remote.num_tokens = first.kv_lease->num_tokens;
    remote.lease_id = first.kv_lease->lease.lease_id;
    spec.remote_kv = remote;
    if (hand_over) spec.mtp_handoff = first.mtp_handoff;
    EXPECT_TRUE(d.engine->AddRequest(static_cast<int64_t>(i), std::move(spec)).ok());
  }
  std::map<int64_t, RequestUpdate> decoded = Drain(*d.engine);
  run.out.results.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    engine_test::SpecResult& r = run.out.results[i];
    r.tokens = prefilled[static_cast<int64_t>(i)].new_token_ids;
    const RequestUpdate& rest = decoded[static_cast<int64_t>(i)];
    r.tokens.insert(r.tokens.end(), rest.new_token_ids.begin(), rest.new_token_ids.end());
    r.reason = rest.finish_reason;
  }
  run.out.stats = d.engine->spec_stats();
  EXPECT_EQ(p.engine->mtp()->num_handoffs(), specs.size());
  EXPECT_EQ(d.engine->mtp()->num_handoffs(), hand_over ? specs.size() : 0u);
  EXPECT_EQ(d.engine->mtp()->num_free_blocks(), d.engine->mtp()->num_blocks());
  EXPECT_EQ(p.engine->mtp()->num_free_blocks(), p.engine->mtp()->num_blocks());
  return run;
}

TEST(MtpDisaggTest, DecodeWorkerDraftsWhatTheMixedWorkerDrafts) {
  const std::vector<RequestSpec> specs = Specs();
  std::unique_ptr<Engine> mixed_engine = MakeEngine(2);
  const engine_test::SpecOutcome mixed = engine_test::RunToCompletion(*mixed_engine, specs);
  ASSERT_GT(mixed.stats.accepted_tokens, 10u)
      << "drafts must be accepted for the counts to see them";

  const PdRun pd = RunPrefillDecode(specs, /*hand_over=*/true);
  ASSERT_EQ(pd.handoffs.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(pd.handoffs[i].has_value()) << "request " << i;
    EXPECT_EQ(pd.handoffs[i]->num_positions, static_cast<int64_t>(specs[i].prompt.size()) - 1);
  }
  engine_test::ExpectSameTokens(mixed, pd.out, "P -> D with the MTP handoff");
  EXPECT_EQ(pd.out.stats.verify_passes, mixed.stats.verify_passes);
  EXPECT_EQ(pd.out.stats.drafted_tokens, mixed.stats.drafted_tokens);
  EXPECT_EQ(pd.out.stats.accepted_tokens, mixed.stats.accepted_tokens);

  // Before the handoff existed: D's MTP saw zeros over the prompt. Greedy still token for token
  // (sampled requests keep only their distribution: other drafts consume other randomness), other
  // drafts.
  const PdRun zeros = RunPrefillDecode(specs, /*hand_over=*/false);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].sampling.temperature > 0.0f) continue;
    EXPECT_EQ(zeros.out.results[i].tokens, mixed.results[i].tokens) << "request " << i;
  }
  std::printf(
      "mixed / 1P1D with handoff / 1P1D zeros: accepted %llu / %llu / %llu of drafted "
      "%llu / %llu / %llu\n",
      static_cast<unsigned long long>(mixed.stats.accepted_tokens),
      static_cast<unsigned long long>(pd.out.stats.accepted_tokens),
      static_cast<unsigned long long>(zeros.out.stats.accepted_tokens),
      static_cast<unsigned long long>(mixed.stats.drafted_tokens),
      static_cast<unsigned long long>(pd.out.stats.drafted_tokens),
      static_cast<unsigned long long>(zeros.out.stats.drafted_tokens));
  EXPECT_NE(zeros.out.stats.accepted_tokens, mixed.stats.accepted_tokens)
      << "the check must see the MTP's prompt inputs";
}

std::unique_ptr<MtpProposer> MakeProposer(const ModelConfig& model) {
  ModelWeights weights = RandomModelWeights(model, kSeed);
  DraftModelOptions options;
  options.num_blocks = 64;
  options.max_model_len = 256;
  auto proposer = MtpProposer::Create(CpuMtpExecutorFactory(1), model,
                                      RandomMtpWeights(model, weights, kSeed + 1), options);
  EXPECT_TRUE(proposer.ok()) << proposer.status();
  return std::move(*proposer);
}

// K = 3 sampled drafts and their distributions q for tokens (prompt + first token).
DraftJob Propose(MtpProposer& proposer, absl::Span<const int32_t> tokens) {
  DraftJob job;
  job.request_id = 1;
  job.tokens = tokens;
  job.num_drafts = 3;
  job.sampling.temperature = 0.8f;
  job.sampling.seed = 11;
  job.sample_step = 1;
  EXPECT_TRUE(proposer.Propose(absl::MakeSpan(&job, 1)).ok());
  EXPECT_EQ(job.drafts.size(), 3u);
  return job;
}

double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double most = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    most = std::max(most, std::abs(a[i] - b[i]));
  }
  return most;
}

// The MTP's own outputs, directly: the decode side's draft distributions q (every position of
// every chained draft, vocabulary 128) after ImportPrompt equal a mixed proposer's that recorded
// the prompt's hidden states itself, on fresh random hidden states; without the handoff (zeros,
// before) they do not.
TEST(MtpDisaggTest, ImportedProposerDraftsTheMixedProposersDistributions) {
  const ModelConfig model = DeepseekMtp(128);
  const int64_t H = model.hidden_size;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t len : {1, 2, 17, 40}) {
    SCOPED_TRACE(testing::Message() << "prompt of " << len);
    std::vector<int32_t> tokens(static_cast<size_t>(len + 1));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 128);
    const absl::Span<const int32_t> prompt = absl::MakeConstSpan(tokens).first(len);
    std::vector<float> hidden(static_cast<size_t>(len * H));
    for (float& x : hidden) x = normal(rng);

    std::unique_ptr<MtpProposer> mixed = MakeProposer(model);
    mixed->RecordHidden(1, 0, hidden);
    const DraftJob want = Propose(*mixed, tokens);

    std::unique_ptr<MtpProposer> p = MakeProposer(model);
    p->RecordHidden(1, 0, hidden);
    ASSERT_TRUE(p->CatchUpPrompt(1, prompt).ok());
    const std::optional<MtpHandoff> handoff = p->ExportPrompt(1, len);
    ASSERT_TRUE(handoff.has_value());
    EXPECT_EQ(handoff->num_positions, len - 1);
    ASSERT_TRUE(p->ValidateHandoff(*handoff).ok());
    std::unique_ptr<MtpProposer> d = MakeProposer(model);
    d->ImportPrompt(1, *handoff);
    const DraftJob got = Propose(*d, tokens);
    EXPECT_EQ(got.drafts, want.drafts);
    EXPECT_LE(MaxDiff(got.probs, want.probs), 1e-7);

    std::unique_ptr<MtpProposer> zeros = MakeProposer(model);
    const DraftJob before = Propose(*zeros, tokens);
    EXPECT_GT(MaxDiff(before.probs, want.probs), 1e-4) << "zero hidden states draft otherwise";
  }
}

TEST(MtpDisaggTest, HandoffOfAnotherShapeIsRefusedAndIgnoredWithoutMtp) {
  RequestSpec spec;
  spec.prompt = {3, 4, 5, 6};
  spec.max_tokens = 4;
  MtpHandoff good;
  good.num_positions = 3;
  good.row_width = 16 + 8;  // kv_lora_rank + qk_rope_head_dim of DeepseekMtp
  good.latent_rows.assign(3 * 24, 0.5f);
  good.last_hidden.assign(32, 0.25f);

  std::unique_ptr<Engine> d = MakeEngine(2);
  MtpHandoff wide = good;
  wide.row_width = 32;
  wide.latent_rows.assign(3 * 32, 0.5f);
  spec.mtp_handoff = wide;
  absl::Status refused = d->AddRequest(1, spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("latent rows of 32"), std::string::npos) << refused;
  MtpHandoff short_prompt = good;
  short_prompt.num_positions = 2;
  short_prompt.latent_rows.resize(2 * 24);
  spec.mtp_handoff = short_prompt;
  refused = d->AddRequest(2, spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  spec.mtp_handoff = good;
  EXPECT_TRUE(d->AddRequest(3, spec).ok());
  EXPECT_EQ(d->mtp()->held_hidden_rows(3), 1) << "h_{L-1} taken";

  // A decode worker without MTP ignores a prefill worker's handoff.
  std::unique_ptr<Engine> plain = MakeEngine(0);
  spec.mtp_handoff = wide;
  EXPECT_TRUE(plain->AddRequest(4, spec).ok());
}

}  // namespace
}  // namespace tandem::runtime
